"""holoprof.agent."""

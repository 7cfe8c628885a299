"""holoprof.examples."""

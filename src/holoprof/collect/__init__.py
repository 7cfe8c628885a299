"""holoprof.collect."""

"""holoprof.launch."""

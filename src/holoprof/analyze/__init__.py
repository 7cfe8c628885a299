"""holoprof.analyze."""

"""holoprof.present."""

"""The command line, one module per subcommand: parse, orchestrate, print, exit.

Library modules below never parse arguments, print or exit; ``holoprof.cli`` is the entry point."""

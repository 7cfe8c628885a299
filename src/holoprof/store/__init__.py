"""The run directory: format, chunk writer, reader."""

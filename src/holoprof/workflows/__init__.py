"""Workflows: commands that launch traced runs, then analyze and present them (sweep, tune)."""

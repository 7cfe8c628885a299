"""Text that every renderer can print: paths whose bytes are not UTF-8 shown escaped.

A run's directory, its command line or a file the job read may hold bytes that are not UTF-8; Python
keeps them as surrogate escapes (``os.fsdecode``), which a terminal or an HTML file cannot encode.
The renderers show such a byte as ``\\xNN`` (the JSON report keeps the string as it is)."""

from __future__ import annotations

from typing import Any

from holoprof.errors import printable_text


def printable(doc: Any) -> Any:
    """``doc`` (a report: dicts, lists, strings, numbers) with every string :func:`printable_text`."""
    if isinstance(doc, str):
        return printable_text(doc)
    if isinstance(doc, dict):
        return {printable(k): printable(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [printable(v) for v in doc]
    return doc

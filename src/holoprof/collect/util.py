"""Small helpers shared by collectors (standard library only)."""

from __future__ import annotations

import os


def path_bytes(path: str) -> int | None:
    """Bytes of a file, of a directory (recursively), or of a TF checkpoint prefix (its files)."""
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        if os.path.isdir(path):
            return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        parent, base = os.path.split(path)
        parent = parent or "."
        total = sum(
            os.path.getsize(os.path.join(parent, f))
            for f in os.listdir(parent)
            if f.startswith(base) and os.path.isfile(os.path.join(parent, f))
        )
        return total or None
    except OSError:
        return None

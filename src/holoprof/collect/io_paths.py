"""Which files count as the job's I/O, and which are the environment's (both I/O layers).

Left out by default: the interpreter's own files (``sys.prefix``, ``sys.base_prefix``, site-packages,
the standard library), the files of any other Python installation (:func:`python_env_path`:
site-packages, dist-info, ``__pycache__``, ``lib/pythonX.Y``, Python sources ``.py``/``.pyc``
anywhere: the program being imported), ``/proc``, ``/sys``, ``/dev``, holoprof itself and the run
directory, unless ``--io-include PREFIX`` brings them back; ``--io-exclude PREFIX`` leaves out more.

Standard library only: this module loads in every process of a job.
"""

from __future__ import annotations

import os
import site
import sys
from typing import Any

from holoprof.model import python_env_path as python_env_path  # one rule for collectors and analyses


def _absolute(p: str) -> str:
    """``os.path.abspath``, with a leading "//" (which abspath keeps: POSIX leaves it open) read as "/",
    as Linux and the native layer read it."""
    p = os.path.abspath(p)
    return "/" + p.lstrip("/") if p.startswith("//") else p


def norm_prefix(p: str) -> str:
    """A path prefix as both I/O layers compare it: absolute, normalized, no trailing slash."""
    return _absolute(os.path.expanduser(p)).rstrip("/") or "/"


def _key_text(p: str) -> str:
    """An absolute path in the text form of :func:`path_key`."""
    return p if p.isascii() else os.fsencode(p).decode("utf-8", "backslashreplace")


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p if p.endswith("/") else p + "/") for p in prefixes)


def default_excludes(run_dir: str | None = None) -> list[str]:
    """Prefixes left out by default: the interpreter's own files, pseudo file systems, the run."""
    out = ["/proc", "/sys", "/dev"]
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        if p:
            out.append(p)
    # the standard library where this interpreter loads it from (``sysconfig``'s ``stdlib``; its
    # ``platstdlib`` is under a prefix above, its ``purelib`` and ``platlib`` are site-packages):
    # ``sysconfig`` itself would load the interpreter's build variables, about 2 ms in every process
    stdlib = getattr(os, "__file__", None)  # none in a frozen interpreter
    if stdlib:
        out.append(os.path.dirname(stdlib))
    try:
        out += list(site.getsitepackages())
        user = site.getusersitepackages()
        if isinstance(user, str):
            out.append(user)
    except Exception:
        pass
    for p in sys.path:  # other site-packages on the path (a venv's, a --user install's)
        if p and ("site-packages" in p or "dist-packages" in p):
            out.append(p)
    out.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holoprof itself
    if run_dir:
        out.append(run_dir)
    seen: list[str] = []
    for p in out:
        q = norm_prefix(p)
        if q not in seen:
            seen.append(q)
    return seen


class PathPolicy:
    """Which paths are counted: user excludes > user includes > default excludes > everything else."""

    def __init__(
        self, include: list[str] | None = None, exclude: list[str] | None = None, run_dir: str | None = None
    ) -> None:
        # compared with paths as :func:`path_key` writes them (bytes that are not UTF-8 as \xNN)
        self.include = tuple(_key_text(norm_prefix(p)) for p in include or [])
        self.exclude = tuple(_key_text(norm_prefix(p)) for p in exclude or [])
        self.defaults = tuple(_key_text(p) for p in default_excludes(run_dir))
        self._cache: dict[str, bool] = {}

    def keep(self, path: str) -> bool:
        k = self._cache.get(path)
        if k is None:
            k = self._decide(path)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[path] = k
        return k

    def _decide(self, path: str) -> bool:
        if _under(path, self.exclude):
            return False
        if _under(path, self.include):
            return True
        return not (python_env_path(path) or _under(path, self.defaults))


def path_key(file: Any) -> str | None:
    """The normalised text of a path argument (as the native layer writes it), or None."""
    try:
        p = os.fspath(file)
    except TypeError:
        return None
    if isinstance(p, bytes):
        raw = p
        p = os.fsdecode(p)
    else:
        raw = None
    if not p:
        return None
    p = _absolute(p)
    if not p.isascii():
        raw = os.fsencode(p)
        return raw.decode("utf-8", "backslashreplace")
    return p

"""Per-run summaries for ``/metrics``, kept on disk so that a restarted server need not rebuild them.

A summary is what the dashboard's run list and ``/metrics`` need of a run's report: its status, step
count, median step and its Prometheus samples (:func:`holoprof.present.prometheus.run_samples`), a
few kilobytes. The summary of a run that no longer runs never changes while its files do not, so it
is stored under the user's cache folder (``$HOLOPROF_CACHE_DIR``, else
``$XDG_CACHE_HOME/holoprof``, else ``~/.cache/holoprof``), in ``run-summaries/``, one file per run
directory, with the key it was built from: the newest modification time among the run's manifest and
chunks, and how many chunks there are (:func:`holoprof.serve.app.data_key`). A file whose key, run
directory, format or holoprof version differs is ignored and replaced. The cache is only a shortcut:
a folder that cannot be written, or a file that cannot be read, costs a rebuild and nothing else.
The folder can be deleted at any time.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from typing import Any

from holoprof._version import __version__
from holoprof.present.prometheus import run_samples

FORMAT = 1
SUBDIR = "run-summaries"
#: A stored summary larger than this is not read (the file is not one of ours).
MAX_FILE_BYTES = 4 << 20


def default_folder() -> str:
    """Where summaries are stored unless told otherwise (see the module's docstring)."""
    base = os.environ.get("HOLOPROF_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache"), "holoprof")
    return os.path.join(base, SUBDIR)


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """The summary of a report document."""
    steps = doc.get("steps") or {}
    return {
        "status": str((doc.get("run") or {}).get("status", "")),
        "steps": steps.get("count"),
        "median_step_s": steps.get("median_s"),
        "samples": run_samples(doc),
    }


class Store:
    """Summaries on disk, one file per run directory; ``folder=None``: none (every call a no-op)."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder

    def _file(self, run_dir: str) -> str | None:
        if self.folder is None:
            return None
        digest = hashlib.sha256(os.fsencode(run_dir)).hexdigest()[:32]
        return os.path.join(self.folder, f"{digest}.json")

    def get(self, run_dir: str, key: tuple[float, int]) -> dict[str, Any] | None:
        """The stored summary of ``run_dir`` if it was built from data with this key."""
        path = self._file(run_dir)
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
                    return None
                entry = json.loads(f.read())
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(entry, dict) or not isinstance(entry.get("summary"), dict):
            return None
        wanted = {"format": FORMAT, "version": __version__, "run_dir": run_dir, "key": list(key)}
        if any(entry.get(k) != v for k, v in wanted.items()):
            return None
        summary: dict[str, Any] = entry["summary"]
        return summary if isinstance(summary.get("samples"), list) else None

    def put(self, run_dir: str, key: tuple[float, int], summary: dict[str, Any]) -> None:
        """Store the summary (atomically: a reader sees the old file or the new one)."""
        path = self._file(run_dir)
        if path is None:
            return
        entry = {
            "format": FORMAT,
            "version": __version__,
            "run_dir": run_dir,
            "key": list(key),
            "summary": summary,
        }
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".summary-", dir=os.path.dirname(path))
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(entry, f)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except (OSError, ValueError):
            pass  # a cache that cannot be written is no cache: the summary is rebuilt next time

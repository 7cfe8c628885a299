"""Started by Python at interpreter start-up in every process of a job traced by `holoprof run`.

`holoprof run` puts this directory first on PYTHONPATH. Nothing happens unless HOLOPROF_RUN_DIR is
set. Afterwards the user's own `sitecustomize` (the next one on sys.path), if any, still runs.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (this runs in every process)
if TYPE_CHECKING:
    from typing import Any


def _start_agent() -> None:
    try:
        # lazy: loaded only when this runs, not when the agent starts
        from holoprof.collect.startup import start_from_env

        start_from_env()
    except Exception as exc:  # never break the job
        sys.stderr.write(
            f"holoprof: the agent could not start in {sys.executable} ({type(exc).__name__}: {exc}); "
            "this process is not traced. Install holoprof into the environment that runs your job.\n"
        )


def _path_finder() -> Any:
    """importlib.machinery.PathFinder, as the import system holds it (importing importlib costs more
    than the rest of this file)."""
    for finder in sys.meta_path:
        if getattr(finder, "__name__", None) == "PathFinder" and hasattr(finder, "find_spec"):
            return finder
    # lazy: loaded only when this runs
    import importlib.machinery

    return importlib.machinery.PathFinder


def _chain_user_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = _path_finder().find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    # lazy: only where the job has a sitecustomize of its own (importlib.util loads contextlib)
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("HOLOPROF_RUN_DIR"):
    _start_agent()
_chain_user_sitecustomize()

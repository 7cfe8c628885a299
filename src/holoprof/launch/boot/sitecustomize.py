"""Started by Python at interpreter start-up in every process of a job traced by `holoprof run`.

`holoprof run` puts this directory first on PYTHONPATH. Nothing happens unless HOLOPROF_RUN_DIR is
set. Afterwards the user's own `sitecustomize` (the next one on sys.path), if any, still runs.
"""

import gc
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (this runs in every process)
if TYPE_CHECKING:
    from typing import Any

#: The garbage collector's young count where this module paused it, until the agent has started: the
#: agent's own allocations, from here on, do not bring the job's collections forward
#: (holoprof.agent.gc_clock). None: not paused.
_PAUSED_AT = None
if os.environ.get("HOLOPROF_RUN_DIR") and gc.isenabled() and gc.get_threshold()[0] > 0:
    # the standard modules the agent uses first, on the clock: a job that imports them itself (torch
    # does) then allocates as much less later
    import atexit  # noqa: F401
    import threading  # noqa: F401
    import zlib  # noqa: F401

    gc.disable()
    _PAUSED_AT = gc.get_count()[0]


def _start_agent() -> None:
    try:
        # lazy: loaded only when this runs, not when the agent starts
        from holoprof.agent.gc_clock import OffTheClock

        with OffTheClock(paused_at=_PAUSED_AT):
            # lazy: loaded only when this runs, not when the agent starts
            from holoprof.collect.startup import start_from_env

            start_from_env()
    except Exception as exc:  # never break the job
        sys.stderr.write(
            f"holoprof: the agent could not start in {sys.executable} ({type(exc).__name__}: {exc}); "
            "this process is not traced. Install holoprof into the environment that runs your job.\n"
        )
    finally:
        if _PAUSED_AT is not None:
            gc.enable()  # as it was (OffTheClock did, unless its import failed)


def _path_finder() -> "Any":
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

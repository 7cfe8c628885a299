"""Started by Python at interpreter start-up in every process of a job traced by `holoprof run`.

`holoprof run` puts this directory first on PYTHONPATH. Nothing happens unless HOLOPROF_RUN_DIR is
set. Afterwards the user's own `sitecustomize` (the next one on sys.path), if any, still runs.
"""

import os
import sys


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


def _chain_user_sitecustomize() -> None:
    # lazy: loaded only when this runs (importlib.machinery is part of the interpreter's own start-up)
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
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

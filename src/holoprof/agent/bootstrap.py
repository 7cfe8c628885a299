"""Start the agent from the environment that `holoprof run` set up."""

from __future__ import annotations

import json
import os
from typing import Any

from holoprof import model


def options_from_env() -> dict[str, Any]:
    raw = os.environ.get(model.ENV_OPTIONS)
    if not raw:
        return {}
    try:
        opts = json.loads(raw)
    except ValueError:
        return {}
    return opts if isinstance(opts, dict) else {}


def start_from_env() -> None:
    run_dir = os.environ.get(model.ENV_RUN_DIR)
    if not run_dir or not os.path.isdir(run_dir):
        return
    from holoprof.agent.core import start_agent

    start_agent(run_dir, options=options_from_env())

"""Checkpoint phases in the holoprof trace, when the process is traced."""

from __future__ import annotations

import logging
import sys
from typing import Any

from holoprof import api

log = logging.getLogger("holoprof.checkpoint")


def trace_span(start_ns: int, end_ns: int, attrs: dict[str, Any]) -> None:
    """Record a checkpoint phase when the process is traced by holoprof (never fails)."""
    if "holoprof.agent.core" not in sys.modules:
        return
    try:
        agent = api._agent()
        if agent is None or agent.tls.active is not None:
            return
        agent.span("phase", "checkpoint", start_ns, end_ns, agent.steps.index, attrs)
    except Exception as exc:  # tracing never breaks a checkpoint
        log.debug("not traced: %s", exc)

"""``torch.distributed``: the rank is remembered when the process group starts (jobs destroy the group
before they exit, when it can no longer be asked)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Collector


def install_distributed(col: Collector, torch: ModuleType) -> None:
    """Patch ``torch.distributed.init_process_group`` where torch has it."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not hasattr(dist, "init_process_group"):
        return
    agent = col.agent
    orig_init_pg = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig_init_pg(*args, **kwargs)
        try:
            agent.note_distributed()
        except Exception as exc:
            agent.fail(col, exc)
        return out

    init_process_group.__wrapped__ = orig_init_pg  # type: ignore[attr-defined]
    col._set(dist, "init_process_group", init_process_group)

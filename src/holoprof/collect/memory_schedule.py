"""Which steps the memory collector measures: the modes of ``holoprof run --memory`` and the schedule."""

from __future__ import annotations

from holoprof import model
from holoprof.collect.torch.state import NEVER

MODES: tuple[str, ...] = model.MEMORY_MODES
#: Sampled mode: the first ``FIRST_STEPS`` steps, then every ``EVERY``-th step.
FIRST_STEPS = 3
EVERY = 200


def is_sampled(step: int, mode: str, every: int = EVERY) -> bool:
    if mode == "full":
        return True
    if mode != "sampled":
        return False
    return step < FIRST_STEPS or (every > 0 and step % every == 0)


def next_sampled(step: int, mode: str, every: int = EVERY) -> int:
    """The first step from ``step`` on that :func:`is_sampled` measures (:data:`NEVER`: none)."""
    if mode == "full" or (mode == "sampled" and step < FIRST_STEPS):
        return step
    if mode != "sampled" or every <= 0:
        return NEVER
    return -(-step // every) * every

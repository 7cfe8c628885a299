"""Which tier a checkpoint is written to: the measured write speed of each path, and the choice."""

from __future__ import annotations

import threading
from typing import Literal

Tier = Literal["fast", "durable"]
Route = Literal["auto", "fast", "durable"]

#: the fast tier is used only when it writes at least this many times faster than durable storage
FAST_TIER_MIN_SPEEDUP = 1.2


class TierSpeeds:
    """The measured write speed of each path (bytes/s), updated under the buffer's condition ``cond``."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self.fast_bps: float | None = None
        self.durable_bps: float | None = None
        self.samples: dict[Tier, int] = {"fast": 0, "durable": 0}

    def choose_locked(self, route: Route) -> tuple[Tier, str]:
        """The path of the next checkpoint, and why (caller holds ``cond``)."""
        if route != "auto":
            return route, f"route={route!r} was asked for"
        fast, durable = self.fast_bps, self.durable_bps
        if fast is None or durable is None:
            return "fast", "the fast tier is used until the speeds of both tiers are measured"
        speeds = f"fast tier {fast / 1e6:,.0f} MB/s, durable storage {durable / 1e6:,.0f} MB/s (measured)"
        if fast >= FAST_TIER_MIN_SPEEDUP * durable:
            return "fast", speeds
        return "durable", f"the fast tier is not faster than durable storage: {speeds}"

    def learn(self, tier: Tier, nbytes: int, seconds: float) -> None:
        """Update the measured write speed of a path from one write of ``nbytes``."""
        if nbytes < (64 << 10) or seconds <= 0:
            return  # too small to say anything about bandwidth
        bps = nbytes / seconds
        with self._cond:
            self.samples[tier] += 1
            if self.samples[tier] == 1:
                return  # the first write of a path pays first-touch costs (allocator, page cache)
            old = self.fast_bps if tier == "fast" else self.durable_bps
            new = bps if old is None else 0.5 * old + 0.5 * bps
            if tier == "fast":
                self.fast_bps = new
            else:
                self.durable_bps = new

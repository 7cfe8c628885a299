"""The truth a corpus script measures about itself: its own step and epoch counts, its own timers
(time.perf_counter around the calls it makes: the model call, loss.backward(), optimizer.step(), the
next batch) and its losses, written as JSON to $TRUTH_OUT."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any


class Truth:
    def __init__(self) -> None:
        self.timers: dict[str, float] = {}
        self.losses: list[str] = []  # repr of each step's loss: compared bit for bit
        self.steps = 0
        self.epochs = 0

    def add(self, name: str, seconds: float) -> None:
        self.timers[name] = self.timers.get(name, 0.0) + seconds

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with its calls timed under ``name``."""

        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - t0)

        return call

    def write(self, path: str | None = None, **extra: Any) -> None:
        doc = {
            "steps": self.steps,
            "epochs": self.epochs,
            "timers": self.timers,
            "losses": self.losses,
            **extra,
        }
        with open(path or os.environ["TRUTH_OUT"], "w") as f:
            json.dump(doc, f)

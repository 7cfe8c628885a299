"""`holoprof run` options of the I/O profiler: which paths count, which layer, the per-op trace."""

from __future__ import annotations

import argparse
from typing import Any

from holoprof.errors import HoloprofError

LAYERS = ("auto", "native", "python")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("I/O profiling")
    g.add_argument(
        "--io-include",
        action="append",
        metavar="PREFIX",
        default=[],
        help="count files under PREFIX even where they are left out by default (the interpreter's "
        "own files, /proc, /sys, /dev); repeatable",
    )
    g.add_argument(
        "--io-exclude",
        action="append",
        metavar="PREFIX",
        default=[],
        help="do not count files under PREFIX; repeatable",
    )
    g.add_argument(
        "--io-trace",
        action="store_true",
        help="record every I/O operation of the whole run in the io_ops table (heavier)",
    )
    g.add_argument(
        "--io-layer",
        choices=LAYERS,
        default=None,
        help="where I/O is counted: native (the preloaded C library), python (patched Python file "
        "calls), auto (native when loaded; the default)",
    )


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("io_include", "io_exclude"):
        values = list(getattr(args, key, None) or [])
        for v in values:
            if not v or not v.strip():
                flag = "--" + key.replace("_", "-")
                raise HoloprofError(f"{flag} needs a path prefix, e.g. {flag} /data/train")
        if values:
            out[key] = values
    if getattr(args, "io_trace", False):
        out["io_trace"] = True
    layer = getattr(args, "io_layer", None)
    if layer:
        out["io_layer"] = layer
    return out

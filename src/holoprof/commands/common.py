"""Argument types and options shared by several commands."""

from __future__ import annotations

import argparse
import math
from typing import Any

from holoprof.errors import HoloprofError


def finite_float(text: str) -> float:
    """argparse type of every numeric option that takes a fraction: a finite number (no nan or inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def add_engine_arguments(parser: Any) -> None:
    """``--engine duckdb|dask`` and ``--scheduler ADDRESS``, for the commands that read a run."""
    parser.add_argument(
        "--engine",
        choices=("duckdb", "dask"),
        default="duckdb",
        help="query engine (dask: for runs that outgrow one machine; same numbers)",
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="with --engine dask: an existing Dask scheduler (default: a local cluster)",
    )


def check_engine_arguments(args: Any) -> None:
    if args.scheduler and args.engine != "dask":
        raise HoloprofError("--scheduler goes with --engine dask")

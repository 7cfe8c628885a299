"""`holoprof diff RUN_A RUN_B`."""

from __future__ import annotations

import argparse
import json
import sys

from holoprof.analyze.diff import DIFF_SCHEMA, diff_runs
from holoprof.analyze.stats import ALPHA, MIN_EFFECT
from holoprof.commands.common import finite_float
from holoprof.errors import HoloprofError
from holoprof.present.diff import render_diff


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", help="the baseline run (directory or .holoprof pack)")
    parser.add_argument("run_b", help="the run to compare with it")
    parser.add_argument("--json", action="store_true", help=f"print the comparison as JSON ({DIFF_SCHEMA})")
    parser.add_argument(
        "--alpha", type=finite_float, default=ALPHA, help=f"significance level of the test (default {ALPHA})"
    )
    parser.add_argument(
        "--min-effect",
        type=finite_float,
        default=MIN_EFFECT,
        help=f"smallest relative change of the median step called significant (default {MIN_EFFECT})",
    )


def main(args: argparse.Namespace) -> int:
    if not 0 < args.alpha < 1:
        raise HoloprofError("--alpha must be between 0 and 1, e.g. 0.01")
    if args.min_effect < 0:
        raise HoloprofError("--min-effect must be 0 or more, e.g. 0.03 for 3%")
    d = diff_runs(args.run_a, args.run_b, args.alpha, args.min_effect)
    if args.json:
        json.dump(d.to_dict(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    render_diff(d.to_dict())
    return 0

"""`holoprof pack RUN -o FILE`."""

from __future__ import annotations

import argparse
import os
import sys

from holoprof.errors import printable_text
from holoprof.present.progress import progress
from holoprof.store.pack import PACK_SUFFIX, pack_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run directory")
    parser.add_argument(
        "-o", "--out", help=f"the pack to write (default: the run's name + {PACK_SUFFIX}, here)"
    )


def main(args: argparse.Namespace) -> int:
    src = os.path.abspath(args.run)
    out = args.out or (os.path.basename(src.rstrip(os.sep)) + PACK_SUFFIX)
    with progress("packing") as bar:
        path = pack_run(src, out, bar)
    size = os.path.getsize(path)
    sys.stderr.write(
        f"holoprof: packed {printable_text(src)} into {printable_text(path)} ({size / 1e6:.1f} MB)\n"
    )
    return 0

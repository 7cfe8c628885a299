"""`holoprof export RUN --format chrome|tensorboard -o PATH`: a run in another tool's format.

* ``chrome``: one JSON file in the Chrome trace event format (Perfetto, chrome://tracing);
  ``--from S --to S`` keeps the window from S to S seconds after the run start.
* ``tensorboard``: a log directory with an event file of per-step scalars
  (``tensorboard --logdir PATH``).

RUN may be a run directory or a pack (``holoprof pack``).
"""

from __future__ import annotations

import argparse
import os
import sys

from holoprof.errors import HoloprofError

FORMATS = ("chrome", "tensorboard")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run directory or a .holoprof pack")
    parser.add_argument("--format", "-f", required=True, choices=FORMATS, help="chrome or tensorboard")
    parser.add_argument(
        "-o", "--out", required=True, help="the file (chrome) or log directory (tensorboard) to write"
    )
    parser.add_argument("--from", dest="start_s", type=float, help="chrome: start of the window, seconds")
    parser.add_argument("--to", dest="end_s", type=float, help="chrome: end of the window, seconds")


def main(args: argparse.Namespace) -> int:
    from holoprof.store.pack import open_run
    from holoprof.store.reader import load

    if args.start_s is not None and args.start_s < 0:
        raise HoloprofError("--from must be 0 or more seconds after the run start")
    if args.start_s is not None and args.end_s is not None and args.end_s <= args.start_s:
        raise HoloprofError(f"--to ({args.end_s}) must be after --from ({args.start_s})")
    if args.format != "chrome" and (args.start_s is not None or args.end_s is not None):
        raise HoloprofError("--from/--to apply to --format chrome only; leave them out for tensorboard")
    run = load(open_run(args.run))
    out = os.path.abspath(args.out)
    if args.format == "chrome":
        from holoprof.present.chrome_trace import write_chrome_trace

        if os.path.isdir(out):
            raise HoloprofError(f"{out} is a directory; give the trace file to write, e.g. -o trace.json")
        tmp = out + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                stats = write_chrome_trace(run, f, args.start_s, args.end_s)
            os.replace(tmp, out)
        except OSError as exc:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise HoloprofError(f"cannot write {out} ({exc.strerror or exc}); choose a writable path with -o")
        sys.stderr.write(
            f"holoprof: wrote {out}: {stats.spans} spans, {stats.counters} samples, {stats.io_ops} I/O ops, "
            f"{stats.processes} processes; open it in https://ui.perfetto.dev or chrome://tracing\n"
        )
        return 0
    from holoprof.present.tensorboard import write_tensorboard

    if os.path.isfile(out):
        raise HoloprofError(f"{out} is a file; give a log directory for TensorBoard, e.g. -o tb/")
    tb = write_tensorboard(run, out)
    sys.stderr.write(
        f"holoprof: wrote {tb.path}: {tb.steps} steps, {len(tb.tags)} scalars each; "
        f"view with: tensorboard --logdir {out}\n"
    )
    return 0

"""The `holoprof` command. Thin: parses, calls library functions, renders.

Bad input raises HoloprofError, printed as one line ``holoprof: error: ...`` with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from holoprof import __version__
from holoprof.errors import HoloprofError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, no usage dump
        raise HoloprofError(f"{message}; see `{self.prog} --help`")


def finite_float(text: str) -> float:
    """argparse type of every numeric option that takes a fraction: a finite number (no nan or inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _cmd_run(args: argparse.Namespace) -> int:
    from holoprof.launch.run import run

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    options: dict[str, Any] = {}
    if args.sample_interval is not None:
        if args.sample_interval <= 0:
            raise HoloprofError("--sample-interval must be a positive number of seconds, e.g. 0.5")
        options["sample_interval_s"] = args.sample_interval
    if args.flush_interval is not None:
        if not 0 < args.flush_interval <= 1:
            raise HoloprofError("--flush-interval must be between 0 and 1 second")
        options["flush_interval_s"] = args.flush_interval
    for mod in _run_option_modules():
        options.update(mod.run_options(args))
    return run(command, out=args.out, name=args.name, options=options, report=not args.no_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from holoprof.analyze.report import build_report
    from holoprof.store.reader import load

    check_engine_arguments(args)
    doc = build_report(load(args.run), engine=args.engine, scheduler=args.scheduler)
    if args.html == "-":
        if args.json:
            raise HoloprofError("--html - and --json both write to stdout; choose one")
        from holoprof.present.html import render_html

        sys.stdout.buffer.write(render_html(doc).encode("utf-8"))
        return 0
    if args.html:
        from holoprof.present.html import write_html

        write_html(doc, args.html)
        sys.stderr.write(f"holoprof: wrote {args.html}\n")
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    elif not args.html:
        from holoprof.present.terminal import render

        render(doc)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from holoprof.examples.demo import run_demo

    return run_demo(out=args.out, quick=args.quick)


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


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line. The modules of a command's options are imported only for that command
    (``argv``'s first word; every command when ``argv`` is None), which keeps a command's start fast."""
    wanted = next((a for a in argv or () if not a.startswith("-")), None)

    def needed(name: str) -> bool:
        return argv is None or wanted == name

    p = _Parser(prog="holoprof", description="Where the time, memory and bandwidth of ML training go.")
    p.add_argument("--version", action="version", version=f"holoprof {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    r = sub.add_parser("run", help="run a command traced: holoprof run -- python train.py")
    r.add_argument("--out", help="run directory to create (default: ./holoprof-runs/<time>-<name>)")
    r.add_argument("--name", help="name of the run (default: the script's name)")
    r.add_argument(
        "--sample-interval", type=finite_float, help="seconds between resource samples (default 1)"
    )
    r.add_argument(
        "--flush-interval", type=finite_float, help="seconds between flushes to disk (default 1, at most 1)"
    )
    r.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    for mod in _run_option_modules() if needed("run") else []:
        mod.add_run_arguments(r)
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command to trace, after --")
    r.set_defaults(func=_cmd_run)

    rp = sub.add_parser("report", help="report on a run: holoprof report RUN [--json] [--html FILE]")
    rp.add_argument("run", help="a run directory")
    rp.add_argument("--json", action="store_true", help="print the report as JSON (schema holoprof.report/1)")
    rp.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (- for stdout)")
    add_engine_arguments(rp)
    rp.set_defaults(func=_cmd_report)

    d = sub.add_parser("demo", help="train the bundled example traced and print its report")
    d.add_argument("--out", help="run directory to create")
    d.add_argument("--quick", action="store_true", help="a shorter demo (fewer files and steps)")
    d.set_defaults(func=_cmd_demo)

    for name, module in EXTRA_COMMANDS.items():
        _add_extra(sub, name, module, load=needed(name))
    return p


#: Commands implemented in their own modules: name -> (module, help). Each module provides
#: ``add_arguments(parser)`` and ``main(args) -> int``.
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {}
EXTRA_COMMANDS["export"] = (
    "holoprof.present.export_cli",
    "a run as a Chrome trace or TensorBoard logs: holoprof export RUN --format chrome -o trace.json",
)
EXTRA_COMMANDS["pack"] = (
    "holoprof.store.pack",
    "a run as one portable file: holoprof pack RUN -o run.holoprof",
)
EXTRA_COMMANDS["diff"] = ("holoprof.analyze.diff", "compare two runs: holoprof diff RUN_A RUN_B [--json]")
EXTRA_COMMANDS["query"] = (
    "holoprof.present.query",
    'SQL over a run\'s tables and views: holoprof query RUN "SELECT ..." [--json|--csv]',
)
EXTRA_COMMANDS["whatif"] = ("holoprof.present.whatif", "predict data-parallel scaling: holoprof whatif RUN")
EXTRA_COMMANDS["ctl"] = ("holoprof.serve.ctl", "on-demand actions in a running job: holoprof ctl RUN ACTION")
EXTRA_COMMANDS["serve"] = ("holoprof.serve.app", "live dashboard and JSON API: holoprof serve RUNS")
EXTRA_COMMANDS["sweep"] = (
    "holoprof.analyze.sweep",
    "throughput and memory against a parameter: holoprof sweep",
)
EXTRA_COMMANDS["tune"] = (
    "holoprof.analyze.tune",
    "sweep the loader knobs the input_bound finding names and print the measured best: holoprof tune -- COMMAND",
)
EXTRA_COMMANDS["import"] = (
    "holoprof.store.import_darshan",
    "import a trace: holoprof import darshan LOG --out DIR",
)

#: Modules that add options to `holoprof run`: each provides ``add_run_arguments(parser)`` and
#: ``run_options(args) -> dict`` (merged into the agent options, JSON-able).
EXTRA_COMMANDS["iobench"] = (
    "holoprof.bench.iobench",
    "read bandwidth of a dataset against reader threads, block size and prefetch: holoprof iobench PATH",
)

RUN_OPTION_MODULES: list[str] = []
RUN_OPTION_MODULES.append("holoprof.collect.tensorflow")
RUN_OPTION_MODULES.append("holoprof.analyze.checkpoints")
RUN_OPTION_MODULES.append("holoprof.collect.memory")
RUN_OPTION_MODULES.append("holoprof.collect.io_options")
RUN_OPTION_MODULES.append("holoprof.collect.knobs")


def _run_option_modules() -> list[Any]:
    import importlib

    mods = []
    for module_name in RUN_OPTION_MODULES:
        try:
            mods.append(importlib.import_module(module_name))
        except ImportError:  # a broken optional part must not take the whole command down
            continue
    return mods


def _add_extra(sub: Any, name: str, spec: tuple[str, str], load: bool = True) -> None:
    import importlib

    module_name, help_text = spec
    sp = sub.add_parser(name, help=help_text)
    if not load:
        return
    try:
        mod = importlib.import_module(module_name)
    except ImportError as exc:
        missing = str(exc)

        def _unavailable(args: argparse.Namespace) -> int:
            raise HoloprofError(f"`holoprof {name}` is unavailable ({missing}); reinstall holoprof")

        sp.set_defaults(func=_unavailable)
        return
    mod.add_arguments(sp)
    sp.set_defaults(func=mod.main)


def _out_of_memory() -> str:
    limit = os.environ.get("HOLOPROF_MEMORY_LIMIT")
    where = f"HOLOPROF_MEMORY_LIMIT={limit}" if limit else "the default memory limit"
    return (
        f"the analysis ran out of memory under {where}; set HOLOPROF_MEMORY_LIMIT higher "
        "(e.g. HOLOPROF_MEMORY_LIMIT=4GB) or free memory on this machine"
    )


def _corrupt_chunk(exc: BaseException, args: argparse.Namespace | None) -> str | None:
    """The one line for a chunk whose pages cannot be decoded (its footer read fine when the run was
    loaded), or None when ``exc`` is not DuckDB failing to read data."""
    if type(exc).__module__.split(".")[0] not in ("duckdb", "_duckdb") or type(exc).__name__ not in (
        "Error",
        "IOException",
        "InvalidInputException",
        "SerializationException",
    ):
        return None
    from holoprof.store.reader import corrupt_chunks

    text = " ".join(str(exc).split())[:160]
    runs = [getattr(args, a) for a in ("run", "run_a", "run_b") if isinstance(getattr(args, a, None), str)]
    bad = [f for r in runs for f in corrupt_chunks(r)]
    if not bad:
        return None
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return f"the chunk {bad[0]}{more} is corrupt ({text}); move it out of the run directory to read the rest"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
        func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 2
        rc = int(func(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not at exit
        return rc
    except BrokenPipeError:
        # The reader of our output closed it (`holoprof report --json | head`): what Python's
        # documentation advises for SIGPIPE: point stdout at devnull so that the flush at exit is
        # silent, and exit 1.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except HoloprofError as exc:
        message = " ".join(str(exc).split())  # always one line, whatever a library put in it
        sys.stderr.write(f"holoprof: error: {message}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("holoprof: interrupted\n")
        return 130
    except Exception as exc:
        # Python's own, or DuckDB's past its memory limit
        from holoprof.store.reader import is_out_of_memory

        if isinstance(exc, MemoryError) or is_out_of_memory(exc):
            sys.stderr.write(f"holoprof: error: {_out_of_memory()}\n")
            return 2
        chunk = _corrupt_chunk(exc, args if "args" in locals() else None)
        if chunk is None:
            raise
        sys.stderr.write(f"holoprof: error: {chunk}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The `holoprof` command: the entry point over :mod:`holoprof.commands`, one module per subcommand.

Bad input raises HoloprofError, printed as one line ``holoprof: error: ...`` with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from holoprof._version import __version__
from holoprof.errors import HoloprofError, printable_text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, no usage dump
        raise HoloprofError(f"{message}; see `{self.prog} --help`")


#: Every subcommand: name -> (its module in :mod:`holoprof.commands`, help). Each module provides
#: ``add_arguments(parser)`` and ``main(args) -> int``; only the command being run is imported, which
#: keeps a command's start fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "run a command traced: holoprof run -- python train.py"),
    "report": ("report", "report on a run: holoprof report RUN [--json] [--html FILE]"),
    "demo": ("demo", "train the bundled example traced and print its report"),
    "export": (
        "export",
        "a run as a Chrome trace or TensorBoard logs: holoprof export RUN --format chrome -o trace.json",
    ),
    "pack": ("pack", "a run as one portable file: holoprof pack RUN -o run.holoprof"),
    "diff": ("diff", "compare two runs: holoprof diff RUN_A RUN_B [--json]"),
    "query": ("query", 'SQL over a run\'s tables and views: holoprof query RUN "SELECT ..." [--json|--csv]'),
    "whatif": ("whatif", "predict data-parallel scaling: holoprof whatif RUN"),
    "ctl": ("ctl", "on-demand actions in a running job: holoprof ctl RUN ACTION"),
    "serve": ("serve", "live dashboard and JSON API: holoprof serve RUNS"),
    "sweep": ("sweep", "throughput and memory against a parameter: holoprof sweep"),
    "tune": (
        "tune",
        "sweep the loader knobs the input_bound finding names and print the measured best: holoprof tune -- COMMAND",
    ),
    "import": ("imports", "import a trace: holoprof import darshan LOG --out DIR"),
    "iobench": (
        "iobench",
        "read bandwidth of a dataset against reader threads, block size and prefetch: holoprof iobench PATH",
    ),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line. A command's module is imported only for that command (``argv``'s first
    word; every command when ``argv`` is None)."""
    wanted = next((a for a in argv or () if not a.startswith("-")), None)
    p = _Parser(prog="holoprof", description="Where the time, memory and bandwidth of ML training go.")
    p.add_argument("--version", action="version", version=f"holoprof {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text)
        if argv is None or wanted == name:
            _add_command(sp, name, f"holoprof.commands.{module}")
    return p


def _add_command(sp: argparse.ArgumentParser, name: str, module_name: str) -> None:
    try:
        mod = importlib.import_module(module_name)
    except ImportError as exc:  # one broken part must not take the whole command line down
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


#: the commands that only read runs: run again without a chunk whose data turns out not to decode
_READ_ONLY = frozenset({"report", "export", "diff", "whatif", "query"})


def _runs_of(args: argparse.Namespace | None) -> list[str]:
    """The runs a command was given."""
    return [getattr(args, a) for a in ("run", "run_a", "run_b") if isinstance(getattr(args, a, None), str)]


def _run_command(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``func(args)``; a command that only reads runs and fails on a chunk whose data does not decode
    runs again without it (the report's warnings say which were skipped)."""
    try:
        return int(func(args) or 0)
    except Exception as exc:
        if getattr(args, "cmd", None) not in _READ_ONLY:
            raise
        from holoprof.store.reader import skip_corrupt  # lazy: DuckDB, only when a command failed on it

        return skip_corrupt(lambda: int(func(args) or 0), _runs_of(args), failed=exc)


def _corrupt_chunk(exc: BaseException, args: argparse.Namespace | None) -> str | None:
    """The one line for a chunk whose pages cannot be decoded (its footer read fine when the run was
    loaded), or None when ``exc`` is not DuckDB failing to read data."""
    from holoprof.store.reader import (  # lazy: DuckDB, only when a command failed
        corrupt_chunks,
        is_corrupt_data,
    )

    if not is_corrupt_data(exc):
        return None
    text = " ".join(str(exc).split())[:160]
    bad = [f for r in _runs_of(args) for f in corrupt_chunks(r)]
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
        rc = _run_command(func, args)
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
        message = printable_text(" ".join(str(exc).split()))  # always one line, whatever a library put in it
        sys.stderr.write(f"holoprof: error: {message}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("holoprof: interrupted\n")
        return 130
    except Exception as exc:
        # Python's own, or DuckDB's past its memory limit
        from holoprof.store.reader import is_out_of_memory  # lazy: DuckDB, only when a command failed

        if isinstance(exc, MemoryError) or is_out_of_memory(exc):
            sys.stderr.write(f"holoprof: error: {_out_of_memory()}\n")
            return 2
        if isinstance(exc, RecursionError):  # JSON nested past every reader's depth limit
            sys.stderr.write(
                "holoprof: error: an input nests too deeply to be read (RecursionError); the file is "
                "damaged or built to exhaust the parser — check the files the command was given\n"
            )
            return 2
        chunk = _corrupt_chunk(exc, args if "args" in locals() else None)
        if chunk is None:
            raise
        sys.stderr.write(f"holoprof: error: {chunk}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Compile the C sources beside this module (``hp_*.c``, ``hp_*.h``) into ``libholoprof_io.so``.

    python -m holoprof.collect.io_native.build [DEST_DIR]

places the library beside this module (or in DEST_DIR) and prints its path. Every ``*.c`` file of
this folder is part of the one library. The compiler is ``$CC``, else ``cc``, ``gcc`` or ``clang``
from ``PATH``; extra flags may be given in ``$HOLOPROF_IO_CFLAGS``.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

try:
    from holoprof.errors import HoloprofError as _Base
except ImportError:  # run by path from a build hook, before holoprof is importable
    _Base = RuntimeError  # type: ignore[misc,assignment]

LIBRARY_NAME = "libholoprof_io.so"
CFLAGS = ("-O2", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden")
LIBS = ("-ldl", "-pthread")


class BuildError(_Base):
    """The native I/O library could not be compiled."""


def source_dir() -> str:
    """The folder of the C sources and headers (this module's)."""
    return os.path.dirname(os.path.abspath(__file__))


def source_paths() -> list[str]:
    """The library's C sources: every ``*.c`` file in :func:`source_dir`, sorted."""
    return sorted(glob.glob(os.path.join(glob.escape(source_dir()), "*.c")))


def find_compiler() -> list[str] | None:
    """The C compiler command (``$CC`` split like a shell would), or None."""
    cc = os.environ.get("CC")
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


def build(dest_dir: str | None = None, *, compiler: list[str] | None = None) -> str:
    """Compile the library into ``dest_dir`` (default: this package); return the library's path.

    The file appears atomically (compiled under a temporary name, then renamed), so concurrent
    builds and running processes never see a partial library. Raises :class:`BuildError`.
    """
    cc = compiler or find_compiler()
    if not cc:
        raise BuildError(
            "no C compiler found to build the native I/O library; install one "
            "(e.g. apt-get install gcc) or set CC"
        )
    sources = source_paths()
    if not sources:
        raise BuildError(f"no C sources of the native I/O library in {source_dir()}")
    dest_dir = os.path.abspath(dest_dir or source_dir())
    os.makedirs(dest_dir, exist_ok=True)
    target = os.path.join(dest_dir, LIBRARY_NAME)
    fd, tmp = tempfile.mkstemp(prefix=".libholoprof_io-", suffix=".so", dir=dest_dir)
    os.close(fd)
    extra = shlex.split(os.environ.get("HOLOPROF_IO_CFLAGS", ""))
    cmd = [*cc, *CFLAGS, *extra, "-I", source_dir(), "-o", tmp, *sources, *LIBS]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(
                f"compiling the native I/O library failed ({shlex.join(cmd)}):\n{proc.stderr.strip()}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0] in ("-h", "--help")):
        print(__doc__.strip())
        return 0 if args and args[0] in ("-h", "--help") else 2
    try:
        path = build(args[0] if args else None)
    except BuildError as exc:
        print(f"holoprof: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

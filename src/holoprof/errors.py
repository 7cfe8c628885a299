"""Errors that reach the user as one clear line and exit status 2 (never a traceback), and text that
can be printed whatever bytes the paths in it hold."""

from __future__ import annotations


class HoloprofError(Exception):
    """Bad input or an impossible request. The message names the problem and the fix.

    The command line prints ``holoprof: error: <message>`` and exits with status 2.
    """

    exit_code = 2


class MissingExtraError(HoloprofError):
    """An optional dependency is not installed; the message carries the exact install line."""

    def __init__(self, what: str, extra: str, package: str | None = None) -> None:
        pkg = package or extra
        super().__init__(
            f"{what} needs the '{pkg}' package, which is not installed; "
            f"install it with: pip install 'holoprof[{extra}]'"
        )


def printable_text(s: str) -> str:
    """``s`` as text any terminal or file can take: a byte that is not UTF-8 (kept by Python as a
    surrogate escape, :func:`os.fsdecode`) is written ``\\xNN``. Text that is UTF-8 is returned as is."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        pass
    try:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that stands for no byte (read from JSON): \udXXX
        return s.encode("utf-8", "backslashreplace").decode("utf-8")

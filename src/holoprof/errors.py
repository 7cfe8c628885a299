"""Errors that reach the user as one clear line and exit status 2 (never a traceback)."""

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

"""Limits on what holoprof reads from outside: torch traces, packs, Darshan logs.

A file from elsewhere can be built to exhaust memory or time: a few hundred bytes of gzip that
inflate to gigabytes, JSON nested 200,000 levels deep, one string of 512 MiB, a pack of 200,000
entries. Every importer and the pack reader check these limits as they read and stop at the first one
crossed, with one line that names the limit and the environment variable that raises it.

=================================  ===========  ==========================================================
variable                           default      what it bounds
=================================  ===========  ==========================================================
``HOLOPROF_LIMIT_INPUT_BYTES``     64 GiB       bytes read from one input, after decompression (a trace
                                                file, the files of a pack, a Darshan log)
``HOLOPROF_LIMIT_RATIO``           200          decompressed / compressed bytes, once past 16 MiB
``HOLOPROF_LIMIT_JSON_DEPTH``      64           nesting of arrays and objects in a trace
``HOLOPROF_LIMIT_STRING_BYTES``    16 MiB       one JSON string in a trace
``HOLOPROF_LIMIT_PACK_FILES``      20,000       entries of a pack
``HOLOPROF_LIMIT_PARSER_BYTES``    8 GiB        memory (address space) of the process that parses a
                                                Darshan log
``HOLOPROF_LIMIT_PARSER_SECONDS``  3600         time that process may take
=================================  ===========  ==========================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import IO, Any

from holoprof.errors import HoloprofError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: Below this many decompressed bytes the ratio is not checked (small files compress unevenly).
RATIO_FLOOR_BYTES = 16 * MiB


class LimitError(HoloprofError):
    """An input crossed one of these limits (one line: the limit, and how to raise it)."""


@dataclass(frozen=True)
class Limit:
    env: str
    default: int
    what: str


INPUT_BYTES = Limit("HOLOPROF_LIMIT_INPUT_BYTES", 64 * GiB, "bytes after decompression")
RATIO = Limit("HOLOPROF_LIMIT_RATIO", 200, "decompression ratio")
JSON_DEPTH = Limit("HOLOPROF_LIMIT_JSON_DEPTH", 64, "JSON nesting levels")
STRING_BYTES = Limit("HOLOPROF_LIMIT_STRING_BYTES", 16 * MiB, "bytes in one JSON string")
PACK_FILES = Limit("HOLOPROF_LIMIT_PACK_FILES", 20_000, "entries in a pack")
PARSER_BYTES = Limit("HOLOPROF_LIMIT_PARSER_BYTES", 8 * GiB, "bytes of memory for the Darshan parser")
PARSER_SECONDS = Limit("HOLOPROF_LIMIT_PARSER_SECONDS", 3600, "seconds for the Darshan parser")
ALL = (INPUT_BYTES, RATIO, JSON_DEPTH, STRING_BYTES, PACK_FILES, PARSER_BYTES, PARSER_SECONDS)


def value(limit: Limit) -> int:
    """The limit's value: its environment variable (a positive integer) or its default."""
    raw = os.environ.get(limit.env, "").strip()
    if not raw:
        return limit.default
    try:
        v = int(raw.replace("_", ""))
    except ValueError:
        v = 0
    if v <= 0:
        raise HoloprofError(
            f"{limit.env}={raw!r} is not a positive integer; set it to the {limit.what} to allow"
        )
    return v


def exceeded(source: str, found: str, limit: Limit, current: int | None = None) -> LimitError:
    """The one-line error for ``source`` crossing ``limit`` (``found`` says what was found)."""
    v = value(limit) if current is None else current
    return LimitError(
        f"{source}: {found}, over the limit of {v:,} ({limit.what}); the file is damaged or built to "
        f"exhaust memory or time — if you trust it, raise the limit: {limit.env}={2 * v}"
    )


def check_ratio(source: str, produced: int, compressed: int) -> None:
    """Refuse ``produced`` decompressed bytes from ``compressed`` input bytes past the limits."""
    if produced > value(INPUT_BYTES):
        raise exceeded(source, f"more than {produced:,} bytes after decompression", INPUT_BYTES)
    ratio = value(RATIO)
    if produced > RATIO_FLOOR_BYTES and produced > ratio * max(compressed, 1):
        raise exceeded(
            source,
            f"{produced:,} bytes from {compressed:,} compressed (ratio {produced / max(compressed, 1):.0f})",
            RATIO,
        )


class BoundedJSON:
    """A binary stream that checks JSON text as it passes: total size, decompression ratio, nesting
    depth and string length, in numpy over each block read (no per-token Python code), so that a
    streaming parser behind it never sees input past the limits.

    ``compressed`` is the size of the file the stream decompresses (its own size when it is not
    compressed). Bytes are counted as JSON text; strings are tracked across block boundaries, with
    escapes (``\\"``) understood.
    """

    def __init__(
        self, raw: IO[bytes], source: str, compressed: int, scan: bool = True, owner: IO[bytes] | None = None
    ) -> None:
        self.raw = raw
        self.owner = owner  # the file under ``raw`` (a gzip stream's), closed with it
        self.source = source
        self.compressed = compressed
        self.scan = scan
        self.total = 0
        self.depth = 0
        self.in_string = False
        self.string_len = 0
        self.backslashes = 0  # backslashes that ended the previous block (inside a string)
        self.max_depth = value(JSON_DEPTH)
        self.max_string = value(STRING_BYTES)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:  # everything that is left, block by block, each one checked
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        data = self.raw.read(n)
        if data:
            self.total += len(data)
            check_ratio(self.source, self.total, self.compressed)
            if self.scan:
                self._scan(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.raw.close()
        if self.owner is not None:
            self.owner.close()

    def __enter__(self) -> BoundedJSON:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _scan(self, data: bytes) -> None:
        import numpy as np  # lazy: numpy loads only where arrays are built

        a = np.frombuffer(data, dtype=np.uint8)
        n = len(a)
        quotes = np.flatnonzero(a == 0x22)
        if len(quotes):
            # a quote after an odd run of backslashes is escaped: rare, so counted one by one
            suspect = np.flatnonzero(a[np.maximum(quotes - 1, 0)] == 0x5C)
            escaped = np.zeros(len(quotes), dtype=bool)
            for k in suspect.tolist():
                q = int(quotes[k])
                i = q - 1
                while i >= 0 and a[i] == 0x5C:
                    i -= 1
                run = q - 1 - i + (self.backslashes if i < 0 else 0)
                escaped[k] = run % 2 == 1
            if quotes[0] == 0 and self.backslashes % 2 == 1:
                escaped[0] = True
            quotes = quotes[~escaped]
        carried = 1 if self.in_string else 0
        # strings: lengths between an opening and its closing quote (with the carried-over part)
        opens = quotes[carried::2]
        closes = quotes[1 - carried :: 2]
        longest = 0
        if carried:
            longest = self.string_len + (int(closes[0]) if len(closes) else n)
            closes = closes[1:]
        if len(closes):
            longest = max(longest, int((closes - opens[: len(closes)]).max()) - 1)
        ends_inside = (len(quotes) + carried) % 2 == 1
        if ends_inside:
            self.string_len = n - int(opens[-1]) - 1 if len(opens) > len(closes) else self.string_len + n
            longest = max(longest, self.string_len)
        if longest > self.max_string:
            raise exceeded(self.source, f"a JSON string of at least {longest:,} bytes", STRING_BYTES)
        self.in_string = ends_inside
        tail = n - len(data.rstrip(b"\\"))
        self.backslashes = (self.backslashes + n if tail == n else tail) if ends_inside else 0
        # nesting: +1 for [ {, -1 for ] }, at the brackets that an even number of quotes precede
        delta = _brackets()[a]
        at = np.flatnonzero(delta)
        if not len(at):
            return
        outside = (np.searchsorted(quotes, at) + carried) % 2 == 0
        levels = np.cumsum(delta[at[outside]], dtype=np.int64) + self.depth
        if not len(levels):
            return
        deepest = int(levels.max())
        if deepest > self.max_depth:
            raise exceeded(self.source, f"JSON nested at least {deepest} levels deep", JSON_DEPTH)
        self.depth = int(levels[-1])


_BRACKETS: list[Any] = []


def _brackets() -> Any:
    """Byte -> change of nesting: +1 for ``[`` and ``{``, -1 for ``]`` and ``}``, else 0."""
    if not _BRACKETS:
        import numpy as np  # lazy: numpy loads only where arrays are built

        t = np.zeros(256, dtype=np.int8)
        t[[0x5B, 0x7B]] = 1
        t[[0x5D, 0x7D]] = -1
        _BRACKETS.append(t)
    return _BRACKETS[0]

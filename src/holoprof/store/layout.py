"""Finding the chunks of a run: process folders, chunk names, validity."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from holoprof import model

_PART = re.compile(r"^(?P<table>[a-z_]+)-(?P<seq>\d{8,})\.parquet$")
_COMPACT = re.compile(r"^(?P<table>[a-z_]+)-c(?P<first>\d+)-(?P<last>\d+)\.parquet$")
_MAGIC = b"PAR1"


@dataclass
class Chunks:
    files: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in model.TABLES})
    bad: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)


def is_complete_parquet(path: str) -> bool:
    try:
        size = os.path.getsize(path)
        if size < 12:
            return False
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            tail = f.read(4)
        return head == _MAGIC and tail == _MAGIC
    except OSError:
        return False


def process_folders(run_dir: str) -> list[str]:
    out = []
    for entry in sorted(os.listdir(run_dir)):
        if entry in (model.CONTROL_DIR, model.ARTIFACTS_DIR) or entry.startswith("."):
            continue
        p = os.path.join(run_dir, entry)
        if os.path.isdir(p):
            out.append(p)
    return out


def folder_chunks(folder: str) -> dict[str, tuple[list[tuple[int, int, str]], list[tuple[int, str]]]]:
    """Per table: compacted files [(first, last, path)] and parts [(seq, path)]."""
    res: dict[str, tuple[list[tuple[int, int, str]], list[tuple[int, str]]]] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return res
    for n in names:
        m = _COMPACT.match(n)
        if m and m["table"] in model.TABLES:
            res.setdefault(m["table"], ([], []))[0].append(
                (int(m["first"]), int(m["last"]), os.path.join(folder, n))
            )
            continue
        m = _PART.match(n)
        if m and m["table"] in model.TABLES:
            res.setdefault(m["table"], ([], []))[1].append((int(m["seq"]), os.path.join(folder, n)))
    return res


def find_chunks(run_dir: str) -> Chunks:
    """The readable chunks of a run, after converting raw chunks left behind (when writable)."""
    from holoprof.store.raw import convert_folder

    out = Chunks()
    for folder in process_folders(run_dir):
        out.folders.append(folder)
        try:
            _, bad = convert_folder(folder)
            out.bad += bad
        except OSError:
            pass
        for table, (compacted, parts) in folder_chunks(folder).items():
            covered: list[tuple[int, int]] = []
            # a compacted file inside a larger one is a leftover of an interrupted compaction
            compacted = [
                c
                for c in compacted
                if not any(
                    o is not c and o[0] <= c[0] and c[1] <= o[1] and (o[0], o[1]) != (c[0], c[1])
                    for o in compacted
                )
            ]
            for first, last, path in sorted(compacted):
                if is_complete_parquet(path):
                    covered.append((first, last))
                    out.files[table].append(path)
                else:
                    out.bad.append(path)
            for seq, path in sorted(parts):
                if any(a <= seq <= b for a, b in covered):
                    continue  # already inside a compacted file (compaction was interrupted)
                if is_complete_parquet(path):
                    out.files[table].append(path)
                else:
                    out.bad.append(path)
    return out

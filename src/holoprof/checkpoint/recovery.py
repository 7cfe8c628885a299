"""Opening directories a crash left: remove temporary and orphaned files, resume interrupted drains."""

from __future__ import annotations

import logging
from pathlib import Path

from holoprof.checkpoint.format import (
    DATA_RE,
    MANIFEST_SUFFIX,
    TMP_PREFIX,
    CheckpointInfo,
    checksum_file,
    fsync_dir,
    read_manifest,
    remove_files,
    size_matches,
    unlink,
)
from holoprof.checkpoint.retention import prune_durable, prune_fast_locked
from holoprof.checkpoint.state import FastEntry, Ledger

log = logging.getLogger("holoprof.checkpoint")


def recover(ledger: Ledger) -> None:
    """Fill ``ledger`` from what both directories hold (before the threads start)."""
    _recover_durable(ledger)
    resumed = _recover_fast(ledger)
    for entry in ledger.fast.values():
        ledger.fast_bytes[entry.info.data_file] = entry.info.size_bytes
    all_infos = [*ledger.durable.values(), *(e.info for e in ledger.fast.values())]
    for info in all_infos:
        ledger.latest_seq[info.name] = max(ledger.latest_seq.get(info.name, 0), info.seq)
    ledger.next_seq = max((i.seq for i in all_infos), default=0) + 1
    ledger.queue.extend(resumed)
    if resumed:
        log.info("resuming the drain of %d checkpoint(s) interrupted earlier", len(resumed))
    prune_durable(ledger)
    with ledger.cond:
        prune_fast_locked(ledger)


def _scan(directory: Path) -> tuple[dict[str, CheckpointInfo], set[str]]:
    """Remove temporary files; return (valid manifests by name, data file names present)."""
    manifests: dict[str, CheckpointInfo] = {}
    data_files: set[str] = set()
    for path in directory.iterdir():
        fname = path.name
        if fname.startswith(TMP_PREFIX):
            log.info("removing temporary file %s left by an interrupted checkpoint", path)
            unlink(path)
        elif fname.endswith(MANIFEST_SUFFIX):
            name = fname[: -len(MANIFEST_SUFFIX)]
            try:
                info = read_manifest(path, name)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable checkpoint manifest %s: %s", path, exc)
                continue
            manifests[name] = info
        elif DATA_RE.match(fname):
            data_files.add(fname)
    return manifests, data_files


def _recover_durable(ledger: Ledger) -> None:
    durable, durable_data = _scan(ledger.durable_dir)
    for name, info in durable.items():
        if info.data_file in durable_data and size_matches(ledger.durable_dir, info):
            ledger.durable[name] = info
        else:
            log.warning(
                "durable checkpoint %r is damaged (data file %s missing or of the wrong size); ignoring it",
                name,
                info.data_file,
            )
    referenced = {i.data_file for i in durable.values()}
    for orphan in sorted(durable_data - referenced):
        log.info("removing orphaned data file %s (a checkpoint that never completed)", orphan)
        unlink(ledger.durable_dir / orphan)
    fsync_dir(ledger.durable_dir)


def _recover_fast(ledger: Ledger) -> list[CheckpointInfo]:
    """Keep the fast copies that are durable or still verify; returns those to drain again."""
    fast, fast_data = _scan(ledger.fast_dir)
    resumed: list[CheckpointInfo] = []
    kept: set[str] = set()
    for name, info in sorted(fast.items(), key=lambda kv: kv[1].seq):
        d = ledger.durable.get(name)
        if d is not None and d.seq == info.seq and d.crc32 == info.crc32:
            ledger.fast[name] = FastEntry(info, "durable")
            kept.add(info.data_file)
            continue
        if d is not None and d.seq > info.seq:
            remove_files(ledger.fast_dir, info)
            continue
        try:
            bad = checksum_file(ledger.fast_dir / info.data_file, sha256=False).mismatch(info)
        except OSError as exc:
            bad = str(exc)
        if bad is not None:
            log.warning(
                "fast copy of checkpoint %r does not match its manifest and was never made durable; "
                "dropping it",
                name,
            )
            remove_files(ledger.fast_dir, info)
            continue
        ledger.fast[name] = FastEntry(info, "pending")
        kept.add(info.data_file)
        resumed.append(info)
    for orphan in sorted(fast_data - kept):
        unlink(ledger.fast_dir / orphan)
    return resumed

"""What stays: superseded copies, ``keep_last`` on both tiers, evicting drained fast copies, removal."""

from __future__ import annotations

import contextlib
import logging
from collections import deque

from holoprof.checkpoint.format import CheckpointInfo, fsync_dir, manifest_path, remove_files, unlink
from holoprof.checkpoint.state import Ledger

log = logging.getLogger("holoprof.checkpoint")


def superseded_locked(ledger: Ledger, info: CheckpointInfo, *, retention: bool) -> bool:
    """True if a newer save of the name replaced ``info`` (or, with ``retention``, ``keep_last`` drops
    it). Caller holds ``cond``."""
    if ledger.latest_seq.get(info.name, 0) > info.seq:
        return True
    current = ledger.durable.get(info.name)
    if current is not None and current.seq >= info.seq:
        return True
    if retention and ledger.keep_last is not None:
        return sum(1 for d in ledger.durable.values() if d.seq > info.seq) >= ledger.keep_last
    return False


def superseded(ledger: Ledger, info: CheckpointInfo) -> bool:
    """True if draining ``info`` is pointless: a newer save of the name, or retention drops it."""
    with ledger.cond:
        return superseded_locked(ledger, info, retention=True)


def prune_durable(ledger: Ledger) -> None:
    """Delete durable checkpoints beyond ``keep_last`` (manifest first, then data)."""
    if ledger.keep_last is None:
        return
    with ledger.cond:
        ordered = sorted(ledger.durable.values(), key=lambda i: i.seq, reverse=True)
        doomed = ordered[ledger.keep_last :]
        for info in doomed:
            del ledger.durable[info.name]
        prune_fast_locked(ledger)
    if not doomed:
        return
    for info in doomed:
        unlink(manifest_path(ledger.durable_dir, info.name))
    fsync_dir(ledger.durable_dir)
    for info in doomed:
        unlink(ledger.durable_dir / info.data_file)
        log.info("retention: removed checkpoint %r (keep_last=%d)", info.name, ledger.keep_last)


def prune_fast_locked(ledger: Ledger) -> None:
    """Drop drained fast copies whose checkpoint is no longer kept in durable storage."""
    for name, entry in list(ledger.fast.items()):
        if entry.state != "durable":
            continue
        d = ledger.durable.get(name)
        if d is None or d.seq != entry.info.seq:
            drop_fast_locked(ledger, entry.info)


def evict_oldest_locked(ledger: Ledger) -> bool:
    """Drop the oldest drained fast copy to make room; False if there is none."""
    drained = [e for e in ledger.fast.values() if e.state == "durable"]
    if not drained:
        return False
    victim = min(drained, key=lambda e: e.info.seq)
    drop_fast_locked(ledger, victim.info)
    return True


def drop_fast_locked(ledger: Ledger, info: CheckpointInfo) -> None:
    """Forget the fast copy ``info`` and delete its files. Caller holds ``cond``."""
    entry = ledger.fast.get(info.name)
    if entry is not None and entry.info.seq == info.seq:
        del ledger.fast[info.name]
        remove_files(ledger.fast_dir, info)
    else:
        unlink(ledger.fast_dir / info.data_file)
    ledger.fast_bytes.pop(info.data_file, None)
    ledger.cond.notify_all()


def remove(ledger: Ledger, name: str) -> bool:
    """Delete checkpoint ``name`` from both tiers (manifest first); False if there was none."""
    with ledger.cond:
        ledger.check_usable()
        while any(j.name == name for j in ledger.jobs):
            ledger.cond.wait()
    with ledger.durable_lock:
        with ledger.cond:
            # a newer seq makes every earlier copy of the name superseded: in-flight drains skip it
            ledger.latest_seq[name] = ledger.next_seq
            ledger.next_seq += 1
            entry = ledger.fast.pop(name, None)
            ledger.queue = deque(i for i in ledger.queue if i.name != name)
            ledger.failed = [i for i in ledger.failed if i.name != name]
            durable = ledger.durable.pop(name, None)
            ledger.cond.notify_all()
        if entry is not None:
            ledger.fast_bytes.pop(entry.info.data_file, None)
            remove_files(ledger.fast_dir, entry.info)
        if durable is not None:
            unlink(manifest_path(ledger.durable_dir, name))
            with contextlib.suppress(OSError):
                fsync_dir(ledger.durable_dir)
            unlink(ledger.durable_dir / durable.data_file)
    return entry is not None or durable is not None

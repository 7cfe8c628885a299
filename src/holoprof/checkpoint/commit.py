"""Publishing a checkpoint in durable storage: rename the data file, then write the manifest."""

from __future__ import annotations

import os
from pathlib import Path

from holoprof.checkpoint.format import CheckpointInfo, fsync_dir, manifest_names, unlink, write_manifest
from holoprof.checkpoint.retention import prune_durable, superseded_locked
from holoprof.checkpoint.state import Ledger


def commit_durable(ledger: Ledger, info: CheckpointInfo, tmp: Path) -> bool:
    """Publish a fully written, fsynced data file and its manifest. False if superseded."""
    with ledger.durable_lock:
        with ledger.cond:
            skip = superseded_locked(ledger, info, retention=True)
        if skip:
            unlink(tmp)
            return False
        final = ledger.durable_dir / info.data_file
        try:
            os.replace(tmp, final)
        except BaseException:
            unlink(tmp)
            raise
        try:
            fsync_dir(ledger.durable_dir)
            write_manifest(ledger.durable_dir, info, durable=True)  # the commit point
        except BaseException:
            if not manifest_names(ledger.durable_dir, info):
                unlink(final)  # no manifest names it: it would only be an orphan
            raise
        with ledger.cond:
            old = ledger.durable.get(info.name)
            ledger.durable[info.name] = info
        if old is not None and old.data_file != info.data_file:
            unlink(ledger.durable_dir / old.data_file)
        prune_durable(ledger)
    return True

"""Blocking time of a large PyTorch checkpoint: BurstBuffer.save() versus torch.save + fsync.

The baseline is what a training loop does without a burst buffer: ``torch.save`` straight to the
durable directory, then fsync of the file and of the directory (the same durability the burst
buffer's background drain gives). The burst buffer's blocking time is ``save()`` only: serialize to
the fast tier and return; the drain to durable storage runs in the background and is timed
separately (``wait()``), outside the training loop's critical path.

    .venv/bin/python benchmarks/bench_burst.py [--size-mb 256] [--repeats 5]
        [--fast-dir /dev/shm] [--durable-dir DIR_ON_DISK] [--settle-seconds 2]

Prints a markdown table and writes it (and a JSON copy) to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUT_DIR = Path(__file__).resolve().parent / "out"


def fs_type(path: Path) -> str:
    """File-system type of the mount that holds ``path`` (from /proc/mounts), or 'unknown'."""
    best, kind = "", "unknown"
    target = str(path.resolve())
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1]
                if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def make_state_dict(size_mb: int) -> dict[str, Any]:
    import torch

    width = 2048
    layer_bytes = width * width * 4
    layers = max(1, (size_mb << 20) // layer_bytes)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return model.state_dict()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tier_bandwidth(directory: Path, nbytes: int) -> float:
    """Plain write + fsync bandwidth of a directory (bytes/s): what a checkpoint save is bound by."""
    chunk = os.urandom(64 << 20)
    path = directory / "probe.bin"
    os.sync()
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(chunk[: min(left, len(chunk))])
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return nbytes / seconds


def direct_save(sd: dict[str, Any], directory: Path, name: str) -> float:
    import torch

    path = directory / name
    t0 = time.perf_counter()
    torch.save(sd, path)
    fsync_path(path)
    fsync_path(directory)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256, help="checkpoint size (default 256 MB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--settle-seconds", type=float, default=2.0, help="pause after os.sync() before each timed save"
    )
    parser.add_argument("--fast-dir", default="/dev/shm", help="parent of the fast tier (default /dev/shm)")
    parser.add_argument(
        "--durable-dir", default=str(OUT_DIR), help="parent of the durable directory (on disk)"
    )
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        sys.stderr.write("this benchmark needs torch: pip install 'holoprof[torch]'\n")
        return 2
    from holoprof.checkpoint import BurstBuffer

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    Path(args.durable_dir).mkdir(parents=True, exist_ok=True)
    fast = Path(tempfile.mkdtemp(prefix="holoprof-bench-fast-", dir=args.fast_dir))
    durable_root = Path(tempfile.mkdtemp(prefix="holoprof-bench-durable-", dir=args.durable_dir))
    bb_durable = durable_root / "burst"
    direct_dir = durable_root / "direct"
    direct_dir.mkdir()
    durable_fs = fs_type(durable_root)
    if durable_fs in ("tmpfs", "ramfs"):
        sys.stderr.write(f"warning: the durable directory {durable_root} is on {durable_fs}, not a disk\n")

    sd = make_state_dict(args.size_mb)
    size_bytes = sum(t.untyped_storage().nbytes() for t in sd.values())
    probe = {
        "fast": statistics.median(tier_bandwidth(fast, size_bytes) for _ in range(3)),
        "durable": statistics.median(tier_bandwidth(direct_dir, size_bytes) for _ in range(3)),
    }
    rows: list[dict[str, float]] = []
    try:
        with BurstBuffer(
            fast, bb_durable, keep_last=2, fast_capacity_bytes=4 * size_bytes + (64 << 20)
        ) as bb:
            # warm-up: first-touch costs of the allocator, tmpfs pages and the serializer
            bb.save(sd, "warmup")
            bb.wait()
            direct_save(sd, direct_dir, "warmup.pt")
            for rep in range(args.repeats):
                os.sync()
                time.sleep(args.settle_seconds)
                direct_s = direct_save(sd, direct_dir, f"direct-{rep}.pt")
                os.unlink(direct_dir / f"direct-{rep}.pt")
                os.sync()
                time.sleep(args.settle_seconds)
                result = bb.save(sd, f"step-{rep:04d}")
                t0 = time.perf_counter()
                bb.wait()
                drain_s = time.perf_counter() - t0
                rows.append(
                    {
                        "direct_s": direct_s,
                        "burst_blocking_s": result.blocking_s,
                        "burst_drain_s": drain_s,
                        "ratio": direct_s / result.blocking_s,
                    }
                )
            loaded, source = bb.load_with_source(f"step-{args.repeats - 1:04d}")
            assert all(torch.equal(loaded[k], v) for k, v in sd.items()), "round trip mismatch"
    finally:
        shutil.rmtree(fast, ignore_errors=True)
        shutil.rmtree(durable_root, ignore_errors=True)

    med_direct = statistics.median(r["direct_s"] for r in rows)
    med_burst = statistics.median(r["burst_blocking_s"] for r in rows)
    med_ratio = statistics.median(r["ratio"] for r in rows)
    mb = size_bytes / 1e6
    lines = [
        f"### BurstBuffer blocking time, {mb:.0f} MB torch state dict, {args.repeats} repeats",
        "",
        f"fast tier: {args.fast_dir} ({fs_type(fast.parent)}); durable: {args.durable_dir} ({durable_fs}); "
        f"torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs",
        "",
        f"Raw write + fsync bandwidth of {mb:.0f} MB (median of 3): fast tier {probe['fast'] / 1e6:,.0f} MB/s, "
        f"durable {probe['durable'] / 1e6:,.0f} MB/s. The blocking-time gain is bounded by their ratio "
        f"({probe['durable'] and probe['fast'] / probe['durable']:.2f}x here).",
        "",
        "| repeat | torch.save + fsync (s) | BurstBuffer.save (s) | background drain (s) | speed-up |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, r in enumerate(rows):
        lines.append(
            f"| {i + 1} | {r['direct_s']:.3f} | {r['burst_blocking_s']:.3f} | {r['burst_drain_s']:.3f} "
            f"| {r['ratio']:.2f}x |"
        )
    lines += [
        f"| **median** | **{med_direct:.3f}** | **{med_burst:.3f}** | "
        f"**{statistics.median(r['burst_drain_s'] for r in rows):.3f}** | **{med_ratio:.2f}x** |",
        "",
        f"Median blocking-time ratio (direct / burst): **{med_ratio:.2f}x** "
        f"({mb / med_direct:.0f} MB/s direct vs {mb / med_burst:.0f} MB/s into the burst buffer). "
        f"Last checkpoint loaded back from the {source} tier and compared tensor by tensor.",
    ]
    table = "\n".join(lines)
    print(table)
    (OUT_DIR / "bench_burst.md").write_text(table + "\n")
    (OUT_DIR / "bench_burst.json").write_text(
        json.dumps(
            {
                "size_bytes": size_bytes,
                "repeats": rows,
                "median_ratio": med_ratio,
                "median_direct_s": med_direct,
                "median_burst_blocking_s": med_burst,
                "fast_fs": fs_type(Path(args.fast_dir)),
                "durable_fs": durable_fs,
                "tier_write_fsync_bytes_per_s": probe,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

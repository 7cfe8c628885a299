"""Blocking time of a PyTorch checkpoint: BurstBuffer.save() against torch.save + fsync and DCP async_save.

The durable tier is a real file system whose writes are throttled by the kernel: an ext4 file system
on a loop device, with the cgroup v1 blkio controller's ``blkio.throttle.write_bps_device`` limiting
the loop device's writes (``--throttle-mb-s``, set up and removed by this script; needs root). Or
pass ``--durable-dir`` to use a directory you prepared (a network file system, a slow disk).

For each state size it measures, on the training thread:

- ``memcpy``: copying the state's tensors into preallocated host tensors with ``memmove``, one
  thread, and with torch's ``copy_`` (the floor of any snapshot: the faster of the two is the
  reference);
- ``torch.save + fsync``: ``torch.save`` to the durable tier, then fsync of the file and directory;
- ``DCP async_save``: ``torch.distributed.checkpoint.async_save`` to the durable tier (call time);
- ``BurstBuffer.save``: the snapshot; the write and the drain run in the background.

and, for the asynchronous ones, the time until the checkpoint is durable. Before each timed save the
page cache is written back (``os.sync()``) and the script pauses, so no save pays for the previous
one. After the last BurstBuffer save the state is changed in place at once (as training does), and
the checkpoint loaded back from durable storage is compared with the state at the save.

    .venv/bin/python benchmarks/bench_burst.py [--sizes-mb 64,256,1024,2048] [--repeats 3]
        [--throttle-mb-s 200 | --durable-dir DIR] [--fast-dir /dev/shm]

Prints a markdown table and writes it (and a JSON copy) to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from holoprof.bench.iobench import fs_type

OUT_DIR = Path(__file__).resolve().parent / "out"
BLKIO_WRITE_BPS = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def throttled_loop_fs(image_dir: Path, size_gb: int, bytes_per_s: int) -> Iterator[Path]:
    """An ext4 file system on a loop device whose writes the blkio controller limits to ``bytes_per_s``."""
    if os.geteuid() != 0:
        raise SystemExit("--throttle-mb-s needs root (losetup, mount, blkio); or pass --durable-dir")
    if not BLKIO_WRITE_BPS.exists():
        raise SystemExit(
            f"{BLKIO_WRITE_BPS} is missing (no cgroup v1 blkio controller here); "
            "pass --durable-dir with a slow file system instead"
        )
    image = image_dir / "holoprof-bench-durable.img"
    mnt = Path(tempfile.mkdtemp(prefix="holoprof-bench-mnt-"))
    with open(image, "wb") as f:
        f.truncate(size_gb << 30)
    loop = sh("losetup", "--find", "--show", str(image))
    majmin = Path(f"/sys/block/{Path(loop).name}/dev").read_text().strip()
    try:
        # no lazy initialisation: a background thread would otherwise write inode tables while we measure
        sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop)
        sh("mount", loop, str(mnt))
        BLKIO_WRITE_BPS.write_text(f"{majmin} {bytes_per_s}\n")
        yield mnt
    finally:
        with contextlib.suppress(OSError):
            BLKIO_WRITE_BPS.write_text(f"{majmin} 0\n")
        subprocess.run(["umount", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", loop], check=False)
        image.unlink(missing_ok=True)
        mnt.rmdir()


def make_state_dict(size_mb: int) -> dict[str, Any]:
    import torch

    width = 2048
    layers = max(1, (size_mb << 20) // (width * width * 4))
    torch.manual_seed(0)
    return {f"layer{i}.weight": torch.randn(width, width) for i in range(layers)}


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_fsync_bandwidth(directory: Path, nbytes: int) -> float:
    """Plain write + fsync bandwidth of a directory (bytes/s)."""
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


def settle(seconds: float) -> None:
    os.sync()
    time.sleep(seconds)


def fingerprint(sd: dict[str, Any]) -> dict[str, str]:
    import hashlib

    return {k: hashlib.sha256(v.numpy().tobytes()).hexdigest() for k, v in sd.items()}


def bench_size(size_mb: int, args: argparse.Namespace, fast_root: Path, durable_root: Path) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp

    from holoprof.checkpoint import BurstBuffer

    sd = make_state_dict(size_mb)
    nbytes = sum(t.untyped_storage().nbytes() for t in sd.values())
    fast = Path(tempfile.mkdtemp(prefix="bb-fast-", dir=fast_root))
    durable = Path(tempfile.mkdtemp(prefix="bb-durable-", dir=durable_root))
    direct_dir = Path(tempfile.mkdtemp(prefix="direct-", dir=durable_root))
    dcp_dir = Path(tempfile.mkdtemp(prefix="dcp-", dir=durable_root))
    rows: dict[str, list[float]] = {
        k: []
        for k in ("memcpy", "torch_copy", "clone", "direct", "dcp_block", "dcp_total", "bb_block", "bb_total")
    }
    paths: list[str] = []
    expected: dict[str, str] | None = None
    try:
        dst = {k: torch.empty_like(v) for k, v in sd.items()}
        bb = BurstBuffer(fast, durable, keep_last=1, route=args.route)
        try:
            bb.save(sd, "warm-up").wait()  # first-touch costs of buffers, tmpfs pages, serializer
            bb.wait()
            for rep in range(args.repeats):
                t0 = time.perf_counter()
                for k, v in sd.items():
                    ctypes.memmove(dst[k].data_ptr(), v.data_ptr(), v.untyped_storage().nbytes())
                rows["memcpy"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for k, v in sd.items():
                    dst[k].copy_(v)
                rows["torch_copy"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                clones = {k: v.clone() for k, v in sd.items()}
                rows["clone"].append(time.perf_counter() - t0)
                del clones

                settle(args.settle_seconds)
                path = direct_dir / f"direct-{rep}.pt"
                t0 = time.perf_counter()
                torch.save(sd, path)
                fsync_path(path)
                fsync_path(direct_dir)
                rows["direct"].append(time.perf_counter() - t0)
                path.unlink()

                settle(args.settle_seconds)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # no process group: DCP warns and saves alone
                    t0 = time.perf_counter()
                    future = dcp.async_save(sd, checkpoint_id=str(dcp_dir / f"step-{rep}"))
                    rows["dcp_block"].append(time.perf_counter() - t0)
                    future.result()
                    os.sync()  # DCP does not fsync; durability costs the same write-back
                    rows["dcp_total"].append(time.perf_counter() - t0)
                shutil.rmtree(dcp_dir / f"step-{rep}")

                settle(args.settle_seconds)
                last = rep == args.repeats - 1
                if last:
                    expected = fingerprint(sd)
                t0 = time.perf_counter()
                result = bb.save(sd, f"step-{rep:04d}")
                blocked = time.perf_counter() - t0
                if last:
                    for v in sd.values():  # training goes on and changes the tensors at once
                        v.add_(1.0)
                result.wait()
                bb.wait()
                rows["bb_total"].append(time.perf_counter() - t0)
                rows["bb_block"].append(blocked)
                paths.append(result.tier)
                if last:
                    for v in sd.values():
                        v.sub_(1.0)
        finally:
            bb.close()
        # a new BurstBuffer with an empty fast tier: the checkpoint comes from durable storage
        with BurstBuffer(fast_root / f"verify-{size_mb}", durable) as other:
            loaded, source = other.load_with_source(f"step-{args.repeats - 1:04d}")
        equal = source == "durable" and fingerprint(loaded) == expected
        del loaded
    finally:
        for d in (fast, durable, direct_dir, dcp_dir, fast_root / f"verify-{size_mb}"):
            shutil.rmtree(d, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {"size_mb": size_mb, "bytes": nbytes, "rows": rows, "median": med, "paths": paths, "equal": equal}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="64,256,1024,2048", help="state sizes in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle-seconds", type=float, default=1.0)
    parser.add_argument("--fast-dir", default="/dev/shm", help="parent of the fast tier (default /dev/shm)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--throttle-mb-s", type=float, default=200.0, help="blkio write limit (MB/s)")
    where.add_argument("--durable-dir", help="parent of the durable directory (instead of a throttled loop)")
    parser.add_argument("--image-dir", default="/var/tmp", help="where the loop device's image lives")
    parser.add_argument("--route", default="auto", choices=["auto", "fast", "durable"])
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes_mb.split(",") if x.strip()]

    try:
        import torch
    except ImportError:
        sys.stderr.write("this benchmark needs torch: pip install 'holoprof[torch]'\n")
        return 2
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    fast_root = Path(tempfile.mkdtemp(prefix="holoprof-bench-", dir=args.fast_dir))
    with contextlib.ExitStack() as stack:
        if args.durable_dir:
            durable_root = Path(args.durable_dir)
            durable_desc = f"{durable_root} ({fs_type(str(durable_root))})"
        else:
            limit = int(args.throttle_mb_s * 1e6)
            need_gb = max(4, 3 * max(sizes) // 1024 + 3)
            durable_root = stack.enter_context(throttled_loop_fs(Path(args.image_dir), need_gb, limit))
            durable_desc = (
                f"ext4 on a loop device (image in {args.image_dir}), writes limited to "
                f"{args.throttle_mb_s:g} MB/s by blkio.throttle.write_bps_device (cgroup v1)"
            )
        stack.callback(shutil.rmtree, fast_root, True)
        probe_bytes = 256 << 20
        probe = {
            "fast": statistics.median(write_fsync_bandwidth(fast_root, probe_bytes) for _ in range(2)),
            "durable": statistics.median(write_fsync_bandwidth(durable_root, probe_bytes) for _ in range(2)),
        }
        results = [bench_size(mb, args, fast_root, durable_root) for mb in sizes]

    load = os.getloadavg()
    lines = [
        f"### BurstBuffer blocking time, {args.repeats} repeats per size (median)",
        "",
        f"durable tier: {durable_desc}; fast tier: {args.fast_dir} ({fs_type(args.fast_dir)}); "
        f"write + fsync of 256 MiB: durable {probe['durable'] / 1e6:,.0f} MB/s, fast {probe['fast'] / 1e6:,.0f} MB/s; "
        f"torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average at the end {load[0]:.1f}",
        "",
        "| state | memcpy: memmove / torch copy_ (s) | torch.save + fsync (s) | DCP async_save: blocks / durable (s) | "
        "BurstBuffer.save: blocks / durable (s) | path | vs torch.save | vs DCP | vs memcpy | equal |",
        "| ---: | ---: | ---: | ---: | ---: | :-- | ---: | ---: | ---: | :-: |",
    ]
    for r in results:
        m = r["median"]
        floor = min(m["memcpy"], m["torch_copy"])
        lines.append(
            f"| {r['bytes'] / 2**20:,.0f} MiB | {m['memcpy']:.3f} / {m['torch_copy']:.3f} | {m['direct']:.3f} | "
            f"{m['dcp_block']:.3f} / {m['dcp_total']:.2f} | {m['bb_block']:.3f} / {m['bb_total']:.2f} | "
            f"{'/'.join(sorted(set(r['paths'])))} | {m['direct'] / m['bb_block']:.1f}x less | "
            f"{m['dcp_block'] / m['bb_block']:.1f}x less | {m['bb_block'] / floor:.2f}x | "
            f"{'yes' if r['equal'] else 'NO'} |"
        )
    table = "\n".join(lines)
    print(table)
    (OUT_DIR / "bench_burst.md").write_text(table + "\n")
    (OUT_DIR / "bench_burst.json").write_text(
        json.dumps({"probe_bytes_per_s": probe, "durable": durable_desc, "results": results}, indent=1) + "\n"
    )
    return 0 if all(r["equal"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

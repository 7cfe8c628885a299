"""Validate `holoprof whatif` against real data-parallel runs.

1. One single-process run of an MLP, traced: `holoprof whatif` predicts the step time of 2 workers at
   each bandwidth from it.
2. Two gloo ranks on loopback (torchrun), untraced: the step time they really take on this machine.
3. Where the machine allows it (root, iproute2): the two ranks in separate network namespaces joined
   by a veth pair whose bandwidth is limited with `tc ... tbf` (100 Mbit/s and 1 Gbit/s by default):
   measured step times against the predictions, and the prediction error.

Namespaces and links are removed whatever happens (finally, SIGTERM/SIGINT). Prints a markdown
section; `--json FILE` also writes the numbers.

    sudo .venv/bin/python benchmarks/bench_whatif.py [--rates 100mbit,1gbit] [--width 1024 --depth 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "dist_scripts" / "mlp.py"
PY = sys.executable


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLOPROF_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _median_step(out: str) -> float:
    vals = [float(m) for m in re.findall(r"median_step_s ([0-9.]+)", out)]
    if not vals:
        raise RuntimeError(f"no step time in the output:\n{out[-2000:]}")
    return max(vals)  # ranks are synchronized: the slower rank's median is the job's


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model_args(a: argparse.Namespace) -> list[str]:
    return [
        "--steps",
        str(a.steps),
        "--width",
        str(a.width),
        "--depth",
        str(a.depth),
        "--batch",
        str(a.batch),
    ]


def single_run(a: argparse.Namespace, tmp: str) -> tuple[str, float]:
    run_dir = os.path.join(tmp, "single")
    cmd = [
        PY,
        "-m",
        "holoprof.cli",
        "run",
        "--out",
        run_dir,
        "--no-report",
        "--",
        str(SCRIPT),
        *_model_args(a),
    ]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"the single-process run failed:\n{p.stderr[-2000:]}")
    return run_dir, _median_step(p.stdout)


def loopback_run(a: argparse.Namespace) -> float:
    cmd = [
        PY,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_free_port()),
        str(SCRIPT),
        *_model_args(a),
    ]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"the loopback run failed:\n{p.stderr[-2000:]}")
    return _median_step(p.stdout)


ALLREDUCE_BENCH = """
import os, statistics, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(int(sys.argv[1]) // 4)
times = []
for _ in range(6):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    times.append(time.perf_counter() - t0)
print(f"allreduce_s {statistics.median(times[1:]):.6f}", flush=True)
dist.destroy_process_group()
"""


def host_allreduce_bandwidth(nbytes: int, tmp: str) -> float:
    """Bytes/s of a 2-rank gloo allreduce on loopback: the host's own cost (copies, reduction, TCP stack)."""
    path = os.path.join(tmp, "allreduce_bench.py")
    Path(path).write_text(ALLREDUCE_BENCH)
    cmd = [
        PY,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_free_port()),
        path,
        str(nbytes),
    ]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    vals = [float(v) for v in re.findall(r"allreduce_s ([0-9.]+)", p.stdout)]
    if p.returncode != 0 or not vals:
        raise RuntimeError(f"the allreduce benchmark failed:\n{p.stderr[-2000:]}")
    return nbytes / max(vals)  # ring, N=2: 2(N-1)/N = 1 times the bytes cross per rank


# --- network namespaces ------------------------------------------------------------------------------
class Netns:
    """Two namespaces joined by a veth pair (10.77.x.1 <-> 10.77.x.2); removed by close()."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"hpw{tag}a", f"hpw{tag}b")
        self.dev = (f"hpv{tag}a", f"hpv{tag}b")
        self.ip = ("10.77.0.1", "10.77.0.2")
        self.created: list[str] = []

    @staticmethod
    def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)

    def open(self) -> None:
        for ns in self.ns:
            self._ip("netns", "add", ns)
            self.created.append(ns)
        self._ip("link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
        for ns, dev, ip in zip(self.ns, self.dev, self.ip, strict=True):
            self._ip("link", "set", dev, "netns", ns)
            self._ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            self._ip("-n", ns, "link", "set", dev, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    def limit(self, rate: str) -> None:
        burst = "256kb" if rate.lower().endswith("gbit") else "64kb"
        for ns, dev in zip(self.ns, self.dev, strict=True):
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    burst,
                    "latency",
                    "200ms",
                ],
                capture_output=True,
                text=True,
                check=True,
            )

    def close(self) -> None:
        for ns in reversed(self.created):
            self._ip("netns", "del", ns, check=False)  # deleting a namespace removes its veth end
        self.created.clear()

    def run_ranks(self, a: argparse.Namespace, timeout: float) -> float:
        port = str(_free_port())
        procs = []
        for rank, (ns, dev) in enumerate(zip(self.ns, self.dev, strict=True)):
            env = _env()
            env.update(
                RANK=str(rank),
                LOCAL_RANK="0",
                WORLD_SIZE="2",
                MASTER_ADDR=self.ip[0],
                MASTER_PORT=port,
                GLOO_SOCKET_IFNAME=dev,
            )
            procs.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, PY, str(SCRIPT), *_model_args(a)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outs = []
        try:
            for p in procs:
                out, err = p.communicate(timeout=timeout)
                if p.returncode != 0:
                    raise RuntimeError(f"a rank failed in its namespace:\n{err[-2000:]}")
                outs.append(out)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return _median_step("\n".join(outs))


def can_use_netns() -> str | None:
    """None if namespaces and tc can be used here, else the reason."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (apt-get install iproute2)"
    probe = f"hpwprobe{os.getpid() % 100000}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        return f"cannot create a network namespace ({p.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _bits(rate: str) -> str:
    return rate.lower().replace("mbit", "Mbit").replace("gbit", "Gbit")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rates", default="100mbit,1gbit", help="tc rates to test (tc syntax)")
    ap.add_argument("--latency", default="50us", help="latency assumed by the predictions")
    ap.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    ap.add_argument("--no-netns", action="store_true", help="loopback only")
    a = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT / "src"))
    from holoprof.analyze.whatif import parse_bandwidth, parse_latency, whatif
    from holoprof.store.reader import load

    rates = [r.strip() for r in a.rates.split(",") if r.strip()]
    results: dict[str, Any] = {"model": vars(a).copy(), "rows": []}
    netns: Netns | None = None

    def _on_signal(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _on_signal)
    with tempfile.TemporaryDirectory(prefix="bench_whatif_") as tmp:
        try:
            t0 = time.perf_counter()
            run_dir, single_untraced = single_run(a, tmp)
            links = [parse_bandwidth(_bits(r)) for r in rates]
            run = load(run_dir)
            grad_bytes = whatif(run, [2], [1e9]).grad_bytes
            host_bw = host_allreduce_bandwidth(grad_bytes, tmp)
            # the link and the host's own allreduce cost in series: 1/bw = 1/link + 1/host
            bws = [1 / (1 / b + 1 / host_bw) for b in links] + [host_bw]
            pred = whatif(run, [2], bws + links + [1e12], parse_latency(a.latency))
            by_bw = {p.bandwidth_bytes_per_s: p for p in pred.predictions}
            results["host_allreduce_bytes_per_s"] = host_bw
            results["single"] = {
                "step_s_traced": pred.step_s,
                "step_s_script": single_untraced,
                "grad_bytes": pred.grad_bytes,
                "buckets": len(pred.buckets),
                "backward_s": pred.backward_s,
            }
            loop = loopback_run(a)
            results["rows"].append(
                {
                    "network": "loopback (2 ranks, torchrun)",
                    "predicted_s": by_bw[bws[-1]].step_s,
                    "measured_s": loop,
                    "link_only_s": by_bw[1e12].step_s,
                }
            )
            reason = "--no-netns" if a.no_netns else can_use_netns()
            results["netns"] = reason or "used"
            if reason is None:
                netns = Netns()
                netns.open()
                for rate, bw, link in zip(rates, bws, links, strict=False):
                    netns.limit(rate)
                    measured = netns.run_ranks(a, timeout=600)
                    results["rows"].append(
                        {
                            "network": f"veth + tc tbf {_bits(rate)}/s",
                            "predicted_s": by_bw[bw].step_s,
                            "measured_s": measured,
                            "link_only_s": by_bw[link].step_s,
                        }
                    )
            results["wall_s"] = time.perf_counter() - t0
        finally:
            if netns is not None:
                netns.close()

    for row in results["rows"]:
        row["error"] = (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
    s = results["single"]
    cmd = "sudo .venv/bin/python benchmarks/bench_whatif.py " + " ".join(
        f"--{k} {v}"
        for k, v in (
            ("width", a.width),
            ("depth", a.depth),
            ("batch", a.batch),
            ("steps", a.steps),
            ("rates", a.rates),
        )
    )
    lines = [
        "## what-if validation: 2 data-parallel workers (gloo)",
        "",
        f"`{cmd}`",
        "",
        f"MLP {a.depth}x{a.width} (+ head), batch {a.batch} per worker, {a.steps} steps, gradients "
        f"{s['grad_bytes'] / 2**20:.1f} MiB in {s['buckets']} bucket(s). Single process: step "
        f"{1000 * s['step_s_traced']:.1f} ms traced ({1000 * s['step_s_script']:.1f} ms by the script's clock), "
        f"backward {1000 * s['backward_s']:.1f} ms. Predictions from that run (`holoprof whatif`, "
        f"latency {a.latency}); measured = the median step of the 2-rank job. The bandwidth given to the "
        f"model is the link in series with this host's own 2-rank gloo allreduce throughput on loopback "
        f"({results['host_allreduce_bytes_per_s'] * 8 / 1e9:.2f} Gbit/s, measured with a {s['grad_bytes'] / 2**20:.1f} MiB "
        "allreduce): 1/bw = 1/link + 1/host. 'link only' is the prediction with the nominal link bandwidth.",
        "",
        "| network | predicted step | measured step | error | link only (error) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in results["rows"]:
        lo = row["link_only_s"]
        lo_err = (lo - row["measured_s"]) / row["measured_s"]
        lines.append(
            f"| {row['network']} | {1000 * row['predicted_s']:.1f} ms | {1000 * row['measured_s']:.1f} ms | "
            f"{100 * row['error']:+.0f}% | {1000 * lo:.1f} ms ({100 * lo_err:+.0f}%) |"
        )
    if results.get("netns") != "used":
        lines += ["", f"bandwidth-limited runs skipped: {results.get('netns')}"]
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Live runs stay live: the converter compacts a running job's parts (a bounded number of files per
process and table however many chunks it writes), and the dashboard's /metrics follows the job."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import holoprof
from conftest import job_env, start_holoprof
from holoprof.store.compact import LIVE_FILES, LIVE_GRACE_S
from holoprof.store.convert import Converter, find_chunks
from holoprof.store.raw import write_raw

BOUND = LIVE_FILES  # below it, files are not merged yet (these runs have no file of a million rows)


def _files(run_dir: Path, table: str) -> dict[Path, int]:
    return {d: len(os.listdir(d)) for d in run_dir.glob(f"{table}/hostname=*/proc=*")}


def _wait(cond: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_thousands_of_chunks_stay_a_bounded_number_of_files(tmp_path: Path) -> None:
    """A process writes 2000 raw chunks (what a long job writes, flush after flush) while the converter
    runs: after each batch is converted, a reader reads at most BOUND files, and every row is there
    once."""
    run_dir = tmp_path / "run"
    staging = run_dir / "node-4242"
    staging.mkdir(parents=True)
    (run_dir / "manifest.json").write_text('{"schema_version": 1, "status": "finished"}')
    converter = Converter(str(run_dir), interval_s=0.01).start()
    seq, rows_per_chunk = 0, 3
    try:
        for _batch in range(10):
            for _ in range(200):
                ids = [seq * rows_per_chunk + i for i in range(rows_per_chunk)]
                write_raw(str(staging), "spans", {
                    "host": ["node"] * rows_per_chunk, "pid": [4242] * rows_per_chunk, "span_id": ids,
                    "kind": ["step"] * rows_per_chunk, "name": ["step"] * rows_per_chunk,
                    "start_ns": ids, "end_ns": [i + 1 for i in ids], "step": ids,
                }, seq=seq)  # fmt: skip
                seq += 1
            _wait(lambda: not os.listdir(staging), "the converter converts the batch")
            passes = converter.passes + 2
            _wait(lambda: converter.passes >= passes, "two more converter passes")  # noqa: B023
            # (merged files stay LIVE_GRACE_S more, unread: the job below counts them too)
            read = len(find_chunks(str(run_dir), convert=False).files["spans"])
            assert read <= BOUND, f"{read} files read after {seq} chunks"
    finally:
        converter.stop()
    run = holoprof.load(run_dir)
    assert run.rows("SELECT count(*), count(DISTINCT span_id), max(span_id) FROM spans")[0] == (
        seq * rows_per_chunk,
        seq * rows_per_chunk,
        seq * rows_per_chunk - 1,
    )
    assert run.warnings == []


JOB = """
import os, sys, time
import holoprof
out = sys.argv[1]
for i in range(int(sys.argv[2])):
    with holoprof.phase("forward"):
        time.sleep(0.005)
    holoprof.step()
    with open(out + ".tmp", "w") as f:
        f.write(str(i + 1))
    os.replace(out + ".tmp", out)
"""


def test_metrics_follow_a_running_job_and_its_files_stay_bounded(tmp_path: Path) -> None:
    """A job flushing every 5 ms (over a thousand chunks) is served while it runs: /metrics reaches the
    step count the job itself wrote down within seconds, each time it is asked, and no partition holds
    more than a bounded number of files."""
    from holoprof.serve.app import make_server

    job, count_file = tmp_path / "job.py", tmp_path / "steps.txt"
    job.write_text(JOB)
    runs = tmp_path / "runs"
    runs.mkdir()
    proc = start_holoprof(
        "run", "--out", str(runs / "live"), "--no-report", "--flush-interval", "0.005", "--",
        sys.executable, str(job), str(count_file), "2500",
        cwd=tmp_path, env=job_env(),
    )  # fmt: skip
    server = make_server(str(runs), port=0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    most = 0
    try:
        from test_serve_api import Client

        client = Client(server)
        _wait(lambda: count_file.exists(), "the job starts")
        for _ in range(4):
            seen = int(count_file.read_text())  # the job's own count

            def caught_up() -> bool:
                text = client.get("/metrics").body.decode()
                m = re.search(r'^holoprof_steps_total\{[^}]*run="live"[^}]*\} (\S+)$', text, re.M)
                return m is not None and float(m[1]) >= seen  # noqa: B023

            _wait(caught_up, f"/metrics reaches the job's {seen} steps", timeout_s=20)
            summary = client.get("/api/runs").json()["runs"]
            assert summary[0]["id"] == "live" and summary[0]["steps"] >= seen
            most = max([most, *_files(runs / "live", "spans").values()])
            time.sleep(1)
        assert proc.poll() is None, "the job was still running throughout"
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
        server.shutdown()
        server.server_close()
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    live = runs / "live"
    (spans,) = (live / "spans").glob("hostname=*/proc=*")
    last = max(int(m[1]) for f in os.listdir(spans) if (m := re.search(r"-(\d+)\.parquet$", f)))
    assert last >= 1000, f"the job wrote {last} chunks"
    # a converter pass a second at most, each merged file removed LIVE_GRACE_S after its merge
    assert most <= BOUND + 2 * LIVE_GRACE_S, f"{most} files in a partition of a job that wrote {last} chunks"
    assert holoprof.load(live).rows("SELECT count(*) FROM spans WHERE kind = 'step'")[0][0] == 2500

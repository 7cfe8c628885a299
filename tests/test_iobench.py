"""holoprof iobench: byte counts, configurations, JSON, recommendation, plot and bad input."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
from pathlib import Path

import pytest

from holoprof.bench import iobench
from holoprof.bench.iobench import (
    SCHEMA,
    IoBenchRow,
    parse_int_list,
    parse_size,
    recommend,
    run_iobench,
    to_json,
)
from holoprof.commands import iobench as iobench_command
from holoprof.errors import HoloprofError
from holoprof.present.iobench import render_html


@pytest.fixture(scope="module")
def small_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("small")
    rng = random.Random(7)
    total = 0
    for i in range(60):
        sub = root / f"shard{i % 3}"
        sub.mkdir(exist_ok=True)
        size = rng.randint(1, 40_000)
        (sub / f"sample-{i:03d}.bin").write_bytes(rng.randbytes(size))
        total += size
    (root / "empty.bin").write_bytes(b"")
    return root, total


@pytest.fixture(scope="module")
def large_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("large") / "train.tfrecord"
    size = 8 * 1024 * 1024 + 12_345  # not a multiple of any block size
    path.write_bytes(os.urandom(size))
    return path, size


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="holoprof iobench")
    iobench_command.add_arguments(parser)
    rc = iobench_command.main(parser.parse_args(argv))
    return rc, capsys.readouterr().out


def test_directory_of_small_files_reads_every_byte_in_every_configuration(
    small_files: tuple[Path, int],
) -> None:
    root, total = small_files
    result = run_iobench(root, threads=[1, 3], block_sizes=[4096, 65536], prefetch=[0, 2], max_seconds=20)
    assert result.files == 61 and result.total_bytes == total
    configs = {(r.threads, r.block_size, r.prefetch) for r in result.rows}
    assert configs == {(t, b, p) for t in (1, 3) for b in (4096, 65536) for p in (0, 2)}
    for r in result.rows:
        assert r.bytes == total and r.complete
        assert r.files_opened == 60  # the empty file needs no read
        assert r.reads >= 60 and r.iops == pytest.approx(r.reads / r.seconds)
        assert r.bandwidth_bytes_per_s == pytest.approx(r.bytes / r.seconds)
        assert r.cache in ("cold", "warm")
    assert result.recommendation is not None
    assert result.recommendation.dataloader_num_workers in (1, 3)


def test_large_file_is_split_between_readers(large_file: tuple[Path, int]) -> None:
    path, size = large_file
    result = run_iobench(path, threads=[1, 2, 4], block_sizes=[1 << 20], prefetch=[4], max_seconds=20)
    assert [r.threads for r in result.rows] == [1, 2, 4]
    for r in result.rows:
        assert r.bytes == size and r.complete
        assert r.files_opened == r.threads  # one contiguous range per reader
        assert r.reads == pytest.approx(size / (1 << 20), abs=r.threads + 1)


def test_cold_cache_is_verified_or_explained(large_file: tuple[Path, int]) -> None:
    path, _ = large_file
    result = run_iobench(path, threads=[1], max_seconds=20)
    (row,) = result.rows
    if row.cache == "cold":
        assert row.resident_fraction is None or row.resident_fraction <= iobench.COLD_RESIDENT_MAX
    else:
        assert any("warm" in w for w in result.warnings)
    iobench.evict([(str(path), path.stat().st_size)])
    if iobench._MINCORE.available and iobench.fs_type(str(path)) not in ("tmpfs", "ramfs"):
        assert iobench.resident_fraction([(str(path), path.stat().st_size)]) == pytest.approx(0.0, abs=0.05)


def test_warm_mode_says_so(small_files: tuple[Path, int]) -> None:
    root, total = small_files
    result = run_iobench(root, threads=[2], cache="warm", max_seconds=20)
    assert [r.cache for r in result.rows] == ["warm"]
    assert result.rows[0].bytes == total
    assert any("warm cache requested" in w for w in result.warnings)


def test_reader_processes(large_file: tuple[Path, int]) -> None:
    path, size = large_file
    result = run_iobench(
        path, threads=[2], processes=[2], block_sizes=[256 * 1024], prefetch=[0], max_seconds=30
    )
    (row,) = result.rows
    assert (row.threads, row.processes, row.readers) == (2, 2, 4)
    assert row.bytes == size and row.complete


def test_limits_stop_a_configuration_and_say_so(large_file: tuple[Path, int]) -> None:
    path, _ = large_file
    result = run_iobench(path, threads=[1, 2], block_sizes=[65536], max_bytes=1 << 20, max_seconds=20)
    for r in result.rows:
        assert r.bytes == 1 << 20 and not r.complete
    assert any("--max-seconds/--max-bytes" in w for w in result.warnings)


def test_json_document(small_files: tuple[Path, int], capsys: pytest.CaptureFixture[str]) -> None:
    root, total = small_files
    rc, out = cli([str(root), "--threads", "1,2", "--block-size", "16k", "--prefetch", "0", "--json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert doc["schema"] == SCHEMA == "holoprof.iobench/1"
    assert doc["total_bytes"] == total and doc["files"] == 61
    assert len(doc["rows"]) == 2
    keys = {
        "threads",
        "processes",
        "block_size",
        "prefetch",
        "bytes",
        "seconds",
        "bandwidth_bytes_per_s",
        "iops",
        "cache",
    }
    for row in doc["rows"]:
        assert keys <= set(row)
        assert row["bytes"] == total and row["block_size"] == 16384
    rec = doc["recommendation"]
    assert {"dataloader_num_workers", "dataloader_prefetch_factor", "tf_num_parallel_calls", "reason"} <= set(
        rec
    )
    assert "within 10%" in rec["reason"] or "best bandwidth" in rec["reason"]


def test_terminal_table_and_html_plot(
    small_files: tuple[Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = small_files
    plot = tmp_path / "iobench.html"
    rc, out = cli([str(root), "--threads", "1,2", "--prefetch", "0,2", "--plot", str(plot)], capsys)
    assert rc == 0
    assert "Recommendation" in out and "num_workers=" in out and "MB/s" in out
    page = plot.read_text()
    assert page.startswith("<!DOCTYPE html>") and 'data-chart="iobench"' in page and "<svg" not in page
    assert not re.search(r"<script[^>]*\bsrc\s*=|(?:src|href)\s*=\s*[\"']?(?:https?:)?//", page), (
        "self-contained"
    )
    found = re.search(r"window\.HOLOPROF_REPORT = (.*?);</script>", page, re.S)
    assert found, "the chart's data, inline"
    data = json.loads(found.group(1))  # what uPlot draws
    assert data["x"] == [1, 2] and len(data["series"]) == 2  # one line per prefetch depth
    assert [s["label"] for s in data["series"]] == [
        "block 1 MiB, prefetch 0, 1 proc",
        "block 1 MiB, prefetch 2, 1 proc",
    ]
    assert all(v > 0 for s in data["series"] for v in s["values"])
    assert "num_workers=" in page


def test_recommendation_is_the_smallest_reader_count_near_the_best() -> None:
    def row(threads: int, mbps: float, prefetch: int = 4) -> IoBenchRow:
        return IoBenchRow(
            threads, 1, 1 << 20, prefetch, 10**9, 1e9 / (mbps * 1e6), mbps * 1e6, 1.0, "cold", 1, 1, True, 0.0
        )

    rec = recommend([row(1, 300), row(2, 560), row(4, 800), row(8, 850), row(16, 860)])
    assert rec is not None
    assert rec.readers == 4 and rec.dataloader_num_workers == 4 and rec.tf_num_parallel_calls == 4
    assert "4 readers reach 800 MB/s, within 10% of the best 860 MB/s (16 readers)" in rec.reason
    rising = recommend([row(1, 100), row(2, 200), row(4, 400)])
    assert rising is not None and rising.readers == 4 and "try more readers" in rising.reason
    depth = recommend([row(2, 500, prefetch=0), row(2, 700, prefetch=8), row(2, 690, prefetch=2)])
    assert depth is not None and depth.prefetch == 2
    assert recommend([]) is None


@pytest.mark.parametrize(
    ("text", "value"), [("4096", 4096), ("4k", 4096), ("64KiB", 65536), ("1M", 1 << 20), ("2g", 2 << 30)]
)
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_bad_input_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HoloprofError, match="does not exist"):
        run_iobench(tmp_path / "missing")
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(HoloprofError, match="no regular files"):
        run_iobench(tmp_path / "empty-dir")
    (tmp_path / "zeros").mkdir()
    (tmp_path / "zeros" / "a").write_bytes(b"")
    with pytest.raises(HoloprofError, match="are empty"):
        run_iobench(tmp_path / "zeros")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "ok.bin").write_bytes(b"x" * 100)
    (broken / "dangling.bin").symlink_to(tmp_path / "nowhere")  # unreadable even for root
    with pytest.raises(HoloprofError, match=r"cannot read .*dangling\.bin"):
        run_iobench(broken)
    for bad in ("0", "a,b", "", "1,-2"):
        with pytest.raises(HoloprofError, match="threads"):
            parse_int_list(bad, "threads", 1)
    for bad_size in ("12q", "0", "1.5", "-4k"):
        with pytest.raises(HoloprofError, match="block-size"):
            parse_size(bad_size, "block-size")
    good = str(broken / "ok.bin")
    with pytest.raises(HoloprofError, match="prefetch"):
        cli([good, "--prefetch", "x"], capsys)
    with pytest.raises(HoloprofError, match="block-size"):
        cli([good, "--block-size", "1x"], capsys)
    with pytest.raises(HoloprofError, match="max-seconds"):
        cli([good, "--max-seconds", "0"], capsys)
    with pytest.raises(HoloprofError, match="not a directory"):
        cli([good, "--plot", str(tmp_path / "no" / "such" / "dir" / "p.html")], capsys)


def test_html_escapes_the_path(tmp_path: Path) -> None:
    odd = tmp_path / "<b>&data"
    odd.mkdir()
    (odd / "f").write_bytes(b"y" * 1000)
    page = render_html(run_iobench(odd, threads=[1], max_seconds=10))
    assert "<b>&data" not in page and "&lt;b&gt;&amp;data" in page
    assert to_json(run_iobench(odd, threads=[1], max_seconds=10))["path"] == str(odd)

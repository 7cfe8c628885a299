"""The ``io`` section: Darshan-style per-file counters summed over a run, and the I/O findings.

Pure functions of a loaded run. The ``io_files`` rows are cumulative snapshots: the last one per
(host, pid, module, path) is the process's total for that file (``arg_max(counters, ts_ns)``).
Counters are read with DuckDB's ``json_extract`` under their Darshan names (``POSIX_*``, ``STDIO_*``);
both modules are summed (Darshan does not count a ``fread`` again under POSIX). The scans of
``io_files`` are :class:`~holoprof.analyze.engine.Aggregation` queries: under ``--engine dask``
they run on the Dask cluster, with the same SQL and the same rows.

The counters are kept per process, not per phase: "by phase" is therefore "by process role" (the
main loop, DataLoader workers, ranks), which is what the section reports.

Findings:

* ``small_file_io`` — many small files (at least :data:`SMALL_FILES_MIN` files read, median size
  below :data:`SMALL_FILE_BYTES`) or mostly small reads (at least :data:`SMALL_READ_SHARE` of the reads
  below :data:`SMALL_READ_BYTES`, the Darshan bucket boundary nearest to 64 KiB).
* ``io_bandwidth`` — the read bandwidth the job achieved while it was reading is below
  :data:`BANDWIDTH_RATIO` of a reference measured on the same machine: ``holoprof iobench`` results in
  the run's artifacts when present, else the best bandwidth of a single file of the run; for a
  training loop, only when it waits for data and I/O time is a real share of that wait.
* a staging recommendation (which directories to copy to a faster tier, and the expected gain) in
  the evidence, or as a low-severity ``io_bandwidth`` finding of its own.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from typing import Any

from holoprof import model
from holoprof.analyze.datafiles import container_file, not_data
from holoprof.analyze.engine import Aggregation, aggregate
from holoprof.analyze.findings import Finding, severity_of_gain
from holoprof.store import native_dumps, safeio
from holoprof.store.reader import Run

NS = 1e9
KiB = 1024
MiB = 1024 * 1024

SMALL_FILES_MIN = 1000
SMALL_FILE_BYTES = 256 * KiB
SMALL_READ_SHARE = 0.5
#: Reads below this size are "small" (the upper boundary of Darshan's 10K_100K bucket).
SMALL_READ_BYTES = 100 * KiB
SMALL_READ_BUCKETS = ("0_100", "100_1K", "1K_10K", "10K_100K")
#: io_bandwidth fires when achieved / reference is below this.
BANDWIDTH_RATIO = 0.25
#: ... and only when the job read at least this much (a few reads say nothing about a device).
BANDWIDTH_MIN_BYTES = 16 * MiB
#: ... and, for a training loop, when it waits for data and I/O time is at least this share of the wait
#: (a loop that is slow for other reasons reads slowly because it asks for little).
IO_SHARE_OF_WAIT_MIN = 0.25
#: A file's own bandwidth counts as a reference only when at least this much was read from it.
REFERENCE_MIN_BYTES = 1 * MiB
_SMALL_READ_INDEX = tuple(
    i for i, (name, _, _) in enumerate(model.DARSHAN_SIZE_BUCKETS) if name in SMALL_READ_BUCKETS
)
DATA_WAIT_LINK = 0.05
TOP_FILES = 50
TOP_DIRS = 10

_SUMS = (
    ("opens", "OPENS"),
    ("reads", "READS"),
    ("writes", "WRITES"),
    ("seeks", "SEEKS"),
    ("stats", "STATS"),
    ("bytes_read", "BYTES_READ"),
    ("bytes_written", "BYTES_WRITTEN"),
    ("seq_reads", "SEQ_READS"),
    ("consec_reads", "CONSEC_READS"),
    ("max_byte_read", "MAX_BYTE_READ"),
    ("max_byte_written", "MAX_BYTE_WRITTEN"),
    ("mmaps", "MMAPS"),
    ("bytes_mapped", "BYTES_MAPPED"),
    ("max_byte_mapped", "MAX_BYTE_MAPPED"),
    ("mmaps_measured", "MMAPS_MEASURED"),
    ("bytes_mapped_resident", "BYTES_MAPPED_RESIDENT"),
    ("bytes_mapped_distinct", "BYTES_MAPPED_DISTINCT"),
)
_FLOATS = (
    ("read_time_s", "F_READ_TIME"),
    ("write_time_s", "F_WRITE_TIME"),
    ("meta_time_s", "F_META_TIME"),
    ("read_start", "F_READ_START_TIMESTAMP"),
    ("read_end", "F_READ_END_TIMESTAMP"),
)


def _num(name: str, cast: str, col: str = "c") -> str:
    # Darshan writes -1 for "unknown" in shared records: never let it subtract from a sum.
    return (
        f"greatest(coalesce(TRY_CAST(json_extract_string({col}, '$.POSIX_{name}') AS {cast}), "
        f"TRY_CAST(json_extract_string({col}, '$.STDIO_{name}') AS {cast}), 0), 0)"
    )


#: Counters of the modules above POSIX (imported Darshan logs: MPI-IO, HDF5, PnetCDF, DAOS/DFS) per
#: measure of the ``by_module`` totals; a record has only its own module's counters, so their sum is
#: the record's value. POSIX and STDIO records are measured as everywhere else (``_SUMS``).
_MODULE_MEASURES: dict[str, tuple[str, ...]] = {
    "bytes_read": (
        "MPIIO_BYTES_READ",
        "H5D_BYTES_READ",
        "PNETCDF_FILE_BYTES_READ",
        "PNETCDF_VAR_BYTES_READ",
        "DFS_BYTES_READ",
        "DAOS_BYTES_READ",
    ),
    "bytes_written": (
        "MPIIO_BYTES_WRITTEN",
        "H5D_BYTES_WRITTEN",
        "PNETCDF_FILE_BYTES_WRITTEN",
        "PNETCDF_VAR_BYTES_WRITTEN",
        "DFS_BYTES_WRITTEN",
        "DAOS_BYTES_WRITTEN",
    ),
    "reads": (
        "MPIIO_INDEP_READS",
        "MPIIO_COLL_READS",
        "MPIIO_SPLIT_READS",
        "MPIIO_NB_READS",
        "H5D_READS",
        "PNETCDF_VAR_INDEP_READS",
        "PNETCDF_VAR_COLL_READS",
        "PNETCDF_VAR_NB_READS",
        "DFS_READS",
        "DFS_READXS",
        "DAOS_ARRAY_READS",
    ),
    "writes": (
        "MPIIO_INDEP_WRITES",
        "MPIIO_COLL_WRITES",
        "MPIIO_SPLIT_WRITES",
        "MPIIO_NB_WRITES",
        "H5D_WRITES",
        "PNETCDF_VAR_INDEP_WRITES",
        "PNETCDF_VAR_COLL_WRITES",
        "PNETCDF_VAR_NB_WRITES",
        "DFS_WRITES",
        "DFS_WRITEXS",
        "DAOS_ARRAY_WRITES",
    ),
    "opens": (
        "MPIIO_INDEP_OPENS",
        "MPIIO_COLL_OPENS",
        "H5F_OPENS",
        "H5D_OPENS",
        "PNETCDF_FILE_CREATES",
        "PNETCDF_FILE_OPENS",
        "PNETCDF_VAR_OPENS",
        "DFS_OPENS",
        "DAOS_OBJ_OPENS",
        "DAOS_ARRAY_OPENS",
        "DAOS_KV_OPENS",
    ),
}
_BASE_MODULES = ("POSIX", "STDIO")


def _extracted(sql: str) -> str:
    """``sql`` (a SELECT over ``{t}`` whose counters are ``json_extract_string(c, '$.NAME')``) with every
    counter taken from one list extraction per row: DuckDB parses each JSON document once."""
    paths = list(dict.fromkeys(re.findall(r"json_extract_string\(c, '(\$\.[A-Z0-9_]+)'\)", sql)))
    index = {p: i + 1 for i, p in enumerate(paths)}  # DuckDB lists count from 1
    sql = re.sub(
        r"json_extract_string\(c, '(\$\.[A-Z0-9_]+)'\)", lambda m: f"_hp_v[{index[m.group(1)]}]", sql
    )
    listed = ", ".join(f"'{p}'" for p in paths)
    inner = f"(SELECT *, json_extract_string(c, [{listed}]) AS _hp_v FROM {{t}})"
    return sql.replace("FROM {t}", f"FROM {inner}")


def _module_measure(measure: str) -> str:
    terms = " + ".join(
        f"greatest(coalesce(TRY_CAST(json_extract_string(c, '$.{n}') AS BIGINT), 0), 0)"
        for n in _MODULE_MEASURES[measure]
    )
    return f"CASE WHEN module IN {_BASE_MODULES} THEN 0 ELSE {terms} END"


_KEYS = "host, pid, module, path"
#: The last snapshot of every (process, module, file): of the rows with counters, the newest (then the
#: greatest counters, so that equal times give one answer), and the layer of the newest row with one.
#: ``chunk`` keeps the winner of each part with its time, ``combine`` the winner of the winners.
_LAST = Aggregation(
    name="io-files",
    table="io_files",
    columns=("host", "pid", "module", "path", "layer", "counters", "ts_ns"),
    chunk=f"""SELECT {_KEYS},
        arg_max(counters, (ts_ns, counters)) AS c, max(ts_ns) FILTER (WHERE counters IS NOT NULL) AS c_ts,
        arg_max(layer, (ts_ns, layer)) AS layer, max(ts_ns) FILTER (WHERE layer IS NOT NULL) AS layer_ts
        FROM {{t}} GROUP BY {_KEYS}""",
    combine=f"""SELECT {_KEYS}, arg_max(c, (c_ts, c)) AS c, max(c_ts) AS c_ts,
        arg_max(layer, (layer_ts, layer)) AS layer, max(layer_ts) AS layer_ts
        FROM {{t}} GROUP BY {_KEYS}""",
    # every counter is read from one parse of the JSON per row (a list of paths): one extraction per
    # counter parsed each document ~130 times, and under two threads DuckDB then ran out of its
    # memory limit on a run of 2,000 small files
    final=_extracted(
        "SELECT {keys}, layer, {cols} FROM {{t}}".format(
            keys=_KEYS,
            cols=", ".join(
                [f"{_num(k, 'BIGINT')} AS {a}" for a, k in _SUMS]
                + [f"{_num(k, 'DOUBLE')} AS {a}" for a, k in _FLOATS]
                + [
                    f"{_num('SIZE_READ_' + b, 'BIGINT')} AS sr_{i}"
                    for i, (b, _, _) in enumerate(model.DARSHAN_SIZE_BUCKETS)
                ]
                + [f"{_module_measure(m)} AS m_{m}" for m in _MODULE_MEASURES]
            ),
        )
    ),
    order=_KEYS,
)
#: The first and last snapshot times (when the manifest has none).
_BOUNDS = Aggregation(
    name="io-bounds",
    table="io_files",
    columns=("ts_ns",),
    chunk="SELECT min(ts_ns) AS lo, max(ts_ns) AS hi FROM {t}",
    combine="SELECT min(lo) AS lo, max(hi) AS hi FROM {t}",
    final="SELECT coalesce(lo, 0), coalesce(hi, 0) FROM {t}",
)


def _series(t0_ns: int) -> Aggregation:
    """Bytes read between consecutive snapshots of a file, summed per second of the run: the deltas
    need every snapshot of a file together (shuffled on the file), the sums per second do not."""
    return Aggregation(
        name="io-series",
        table="io_files",
        columns=("host", "pid", "module", "path", "ts_ns", "counters"),
        chunk=f"SELECT {_KEYS}, ts_ns, {_num('BYTES_READ', 'BIGINT', 'counters')} AS b FROM {{t}}",
        shuffle=("host", "pid", "module", "path"),
        group=f"""SELECT (ts_ns - $t0) // 1000000000 AS sec, CAST(sum(greatest(db, 0)) AS BIGINT) AS b FROM (
            SELECT ts_ns, b - coalesce(lag(b) OVER (PARTITION BY {_KEYS} ORDER BY ts_ns, b), 0) AS db
            FROM {{t}}) GROUP BY sec""",
        final="SELECT sec, CAST(sum(b) AS BIGINT) AS b FROM {t} GROUP BY sec",
        order="sec",
        params={"t0": t0_ns},
    )


@dataclass
class FileRow:
    host: str
    pid: int
    module: str
    path: str
    layer: str
    v: dict[str, float]
    size_read: list[int]
    #: the ``_MODULE_MEASURES`` of a record of a module above POSIX (empty for POSIX and STDIO)
    other: dict[str, float] = field(default_factory=dict)


def file_rows(run: Run, ctx: dict[str, Any] | None = None) -> list[FileRow]:
    """The last snapshot of every (process, module, file), with the counters the analyses use, in
    (host, pid, module, path) order; on the Dask cluster under ``--engine dask`` (``ctx["engine"]``).
    Kept in ``ctx`` (the stages section reads them too): one scan of ``io_files`` per report."""
    if ctx is not None and "io_file_rows" in ctx:
        return list(ctx["io_file_rows"])
    out = []
    names = [a for a, _ in _SUMS] + [a for a, _ in _FLOATS]
    nb = len(model.DARSHAN_SIZE_BUCKETS)
    for r in aggregate(run, ctx, _LAST):
        host, pid, module, path, layer = r[:5]
        vals = r[5 : 5 + len(names)]
        buckets = r[5 + len(names) : 5 + len(names) + nb]
        other = r[5 + len(names) + nb :]
        out.append(
            FileRow(
                str(host),
                int(pid),
                str(module),
                str(path),
                str(layer),
                {n: float(x or 0) for n, x in zip(names, vals, strict=True)},
                [int(x or 0) for x in buckets],
                {}
                if str(module) in _BASE_MODULES
                else {m: float(x or 0) for m, x in zip(_MODULE_MEASURES, other, strict=True)},
            )
        )
    if ctx is not None:
        ctx["io_file_rows"] = out
    return list(out)


def dump_rows(run: Run, known: set[tuple[str, int]]) -> list[FileRow]:
    """Counters that the native library dumped at exit for processes without an agent.

    A process whose counters are already in ``io_files`` is skipped (never counted twice).
    """
    keys = [a for a, _ in _SUMS] + [a for a, _ in _FLOATS]
    out = []
    for path in native_dumps.dump_files(run.path):
        try:
            rows = native_dumps.read_dump(path)
        except (OSError, ValueError):
            continue
        for r in rows:
            host, pid = str(r["host"]), int(r["pid"])
            if (host, pid) in known:
                break
            c, mod = r["counters"], str(r["module"])

            def get(name: str, c: dict[str, Any] = c, mod: str = mod) -> float:
                v = c.get(f"{mod}_{name}", 0) or 0
                return max(0.0, float(v))

            v = {a: get(k) for a, k in list(_SUMS) + list(_FLOATS)}
            sizes = [int(get(f"SIZE_READ_{b}")) for b, _, _ in model.DARSHAN_SIZE_BUCKETS]
            out.append(FileRow(host, pid, mod, str(r["path"]), "native", {k: v[k] for k in keys}, sizes))
    return out


def _by_module(rows: list[FileRow]) -> dict[str, dict[str, int]]:
    """Totals per Darshan module (records, bytes, operations, opens), largest first. The modules are
    layers of one another (an MPI-IO write is also a POSIX write): their totals are not added up."""
    out: dict[str, dict[str, int]] = {}
    for f in rows:
        vals = f.v if f.module in _BASE_MODULES else f.other
        d = out.setdefault(f.module, {"records": 0, **{m: 0 for m in _MODULE_MEASURES}})
        d["records"] += 1
        for m in _MODULE_MEASURES:
            d[m] += int(vals.get(m, 0))
    return dict(sorted(out.items(), key=lambda kv: (-(kv[1]["bytes_read"] + kv[1]["bytes_written"]), kv[0])))


def _touched(f: FileRow) -> bool:
    v = f.v
    return bool(
        v["opens"] or v["reads"] or v["writes"] or v["bytes_read"] or v["bytes_written"] or _mapped_in(v)
    )


def _mapped_in(v: dict[str, float]) -> bool:
    """Mapped, or brought in through a mapping (a forked child reads through its parent's mappings:
    it made none of them)."""
    return bool(v["mmaps"] or v["bytes_mapped_resident"] or v["bytes_mapped_distinct"])


def _process_pages(v: dict[str, float]) -> float:
    """The distinct bytes of a file one process brought in through its mappings (the resident bytes
    summed over mappings, where the run predates the distinct count)."""
    return v["bytes_mapped_distinct"] or v["bytes_mapped_resident"]


def _mapped_bytes(d: dict[str, float]) -> float:
    """The bytes a file's mappings brought in: its distinct pages (``pages``: the union over mappings
    and processes) where every mapping was measured; where only some were (the native layer measures
    within a time budget), at least that and at most the scaled per-mapping figure; the bytes mapped
    (an upper bound) where none was."""
    if not _mapped_in(d):
        return 0.0
    if d["mmaps_measured"] >= d["mmaps"]:
        return d["pages"]
    if d["mmaps_measured"] > 0:
        scaled = d["bytes_mapped_resident"] * d["mmaps"] / d["mmaps_measured"]
        return max(d["pages"], min(d["bytes_mapped"], scaled, _page_ceil(d["extent"], d)))
    return max(d["pages"], d["bytes_mapped"])


def _page_ceil(n: float, d: dict[str, float]) -> float:
    page = d.get("page_size") or 4096
    return -(-n // page) * page


#: Per process and file, the distinct pages of a mapped file it brought in (its newest record of them).
_PAGES = Aggregation(
    name="io-mapped-pages",
    table="io_files",
    columns=("host", "pid", "path", "mapped_pages", "ts_ns"),
    chunk="""SELECT host, pid, path, arg_max(mapped_pages, ts_ns) AS pages, max(ts_ns) AS ts
        FROM {t} WHERE mapped_pages IS NOT NULL GROUP BY host, pid, path""",
    combine="""SELECT host, pid, path, arg_max(pages, ts) AS pages, max(ts) AS ts
        FROM {t} GROUP BY host, pid, path""",
    final="SELECT host, pid, path, pages FROM {t}",
    order="host, pid, path",
)


def _page_sets(run: Run, ctx: dict[str, Any] | None) -> dict[tuple[str, int, str], str]:
    """The ``mapped_pages`` of every (host, pid, path): from ``io_files``, else from a native dump not
    imported yet (a live run)."""
    out = {(str(h), int(p), str(f)): str(v) for h, p, f, v in aggregate(run, ctx, _PAGES) if v}
    for path in native_dumps.dump_files(run.path):
        try:
            rows = native_dumps.read_dump(path)
        except (OSError, ValueError):
            continue
        for r in rows:
            if r.get("mapped_pages"):
                out.setdefault((str(r["host"]), int(r["pid"]), str(r["path"])), r["mapped_pages"])
    return out


def _mapped_pages(
    run: Run, ctx: dict[str, Any] | None, per: dict[str, dict[str, float]], rows: list[FileRow]
) -> None:
    """Per file, ``pages``: the bytes of the distinct pages brought in through mappings, the union over
    mappings and processes (per host, summed over hosts) of the page sets the native library recorded;
    a process without one (a library that predates them) adds its own count."""
    union: dict[tuple[str, str], list[tuple[int, int]]] = {}
    covered: set[tuple[str, int, str]] = set()
    page_of: dict[str, int] = {}
    for (host, pid, p), text in _page_sets(run, ctx).items():
        got = native_dumps.read_pages(text) if p in per else None
        if got is None or page_of.setdefault(p, got[0]) != got[0]:
            continue
        union.setdefault((host, p), []).extend(got[1])
        covered.add((host, pid, p))
    for (_, p), runs in union.items():
        per[p]["pages"] += native_dumps.union_bytes(runs, page_of[p])
        per[p]["page_size"] = page_of[p]
    for f in rows:
        d = per.get(f.path)
        if d is not None and (f.host, f.pid, f.path) not in covered and f.module == "POSIX":
            d["pages"] += _process_pages(f.v)


def _roles(run: Run) -> dict[tuple[str, int], str]:
    try:
        return {
            (str(h), int(p)): str(r or "child")
            for h, p, r in run.rows("SELECT host, pid, role FROM processes")
        }
    except Exception:
        return {}


def _median(xs: list[float]) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _size_bucket(n: float) -> str:
    for name, lo, hi in model.DARSHAN_SIZE_BUCKETS:
        if lo <= n < hi:
            return name
    return model.DARSHAN_SIZE_BUCKETS[-1][0]


def _iobench_reference(run: Run) -> tuple[float, str] | None:
    """The best read bandwidth in ``holoprof iobench --json`` results saved in the run's artifacts
    (``artifacts/iobench*.json``: any ``*bandwidth_bytes_per_s`` value, writes excepted)."""
    best: tuple[float, str] | None = None
    for path in glob.glob(os.path.join(run.path, model.ARTIFACTS_DIR, "iobench*.json")):
        try:
            doc = safeio.read_json(path, 16 * 2**20)  # a result of iobench --json: a few KiB
        except (OSError, ValueError):
            continue

        def walk(x: Any, path: str = path) -> None:
            nonlocal best
            if isinstance(x, dict):
                for k, v in x.items():
                    if (
                        isinstance(v, (int, float))
                        and not isinstance(v, bool)
                        and str(k).endswith("bandwidth_bytes_per_s")
                        and "write" not in str(k)
                        and (best is None or v > best[0])
                    ):
                        best = (float(v), f"holoprof iobench ({os.path.basename(path)}: {k})")
                    else:
                        walk(v, path)
            elif isinstance(x, list):
                for y in x:
                    walk(y, path)

        walk(doc)
    return best


def _time_series(run: Run, ctx: dict[str, Any] | None, t0_ns: int) -> list[list[float]]:
    """Read bandwidth over time: bytes read between consecutive snapshots, per second of the run."""
    rows = aggregate(run, ctx, _series(t0_ns))
    out = []
    prev: int | None = None
    for sec, b in rows:
        if sec is None:
            continue
        s = int(sec)
        width = 1 if prev is None else max(1, s - prev)
        out.append([float(s), round(float(b or 0) / width, 1)])
        prev = s
    return out


#: Per-file sums of the mapping counters.
_MAPPED_SUMS = ("mmaps", "bytes_mapped", "mmaps_measured", "bytes_mapped_resident", "bytes_mapped_distinct")


def io_section(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    rows = file_rows(run, ctx)
    rows += dump_rows(run, {(f.host, f.pid) for f in rows})
    by_module = _by_module(rows)
    rows = [f for f in rows if _touched(f) or f.v["stats"]]
    if not any(_touched(f) for f in rows) and not any(
        m["opens"] or m["reads"] or m["writes"] for m in by_module.values()
    ):  # stat calls alone are not I/O worth a section
        return {}, []
    st = ctx.get("steps")
    section = _section(run, ctx, rows, by_module, st)
    data, left_out = data_rows(rows, st)
    view = _data_view(run, data, st, _time_base_s(run, ctx), ctx)
    section["training_data"] = _training_data_doc(view, left_out)
    section["staging"] = view["staging"]  # advice: the data's directories, never the environment's
    return section, _findings(run, view, st)


def data_rows(rows: list[FileRow], st: Any) -> tuple[list[FileRow], dict[str, int]]:
    """The rows of the data the training reads, which every I/O finding takes its evidence from, and
    the files left out, counted per reason. Left out: files the job did not read (written, or only
    looked at); files of the job's environment (:func:`holoprof.analyze.datafiles.not_data`: the
    system, Python installations, programs, tool configuration, bookkeeping); and, for a run with a
    training loop, files whose reads all began after its last step (``outside_loop``: the loop never
    waited for them). Files read before the first step are kept: a DataLoader's workers prefetch
    the first batches' files then."""
    window = (st.first_start_ns / NS, st.last_end_ns / NS) if st is not None and st.count else None
    kept: list[FileRow] = []
    left: dict[str, set[str]] = {}
    for f in rows:
        v = f.v
        why = not_data(f.path) if v["reads"] or v["mmaps"] else "not_read"
        if why is None and window is not None and not v["mmaps"] and v["read_start"] > 0:
            why = "outside_loop" if v["read_start"] > window[1] else None
        if why is None:
            kept.append(f)
        else:
            left.setdefault(why, set()).add(f.path)
    return kept, {k: len(v) for k, v in sorted(left.items())}


def _time_base_s(run: Run, ctx: dict[str, Any]) -> float:
    """For a run without a training loop, the time a saving is a share of: its processes' time (the
    processes, launcher aside, times the run's wall time; the ranks of an imported Darshan log)."""
    start_ns, end_ns = _run_bounds(run, ctx)
    try:
        n = int(run.rows("SELECT count(*) FROM processes WHERE role IS DISTINCT FROM 'launcher'")[0][0] or 0)
    except Exception:
        n = 0
    return max(1, n) * max(0.0, (end_ns - start_ns) / NS)


def _files_used(
    run: Run, ctx: dict[str, Any] | None, rows: list[FileRow]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Per path, the sums of the files ``rows`` opened, read, wrote or mapped (with the distinct pages
    their mappings brought in), and of those among them that were read (through calls or mappings)."""
    touched = {
        p: d for p, d in _per_path(rows).items() if d["opens"] or d["reads"] or d["writes"] or _mapped_in(d)
    }
    _mapped_pages(run, ctx, touched, rows)
    return touched, {p: d for p, d in touched.items() if d["bytes_read"] > 0 or _mapped_in(d)}


def _data_view(
    run: Run, rows: list[FileRow], st: Any, base_s: float, ctx: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The measures the I/O findings use, over the data the training reads (:func:`data_rows`)."""
    tot = _totals(rows)
    touched, read_files = _files_used(run, ctx, rows)
    sizes = [d["extent"] for d in read_files.values()]
    ref = _reference_bandwidth(run, read_files)
    io_time = tot["read_time_s"] + tot["write_time_s"] + tot["meta_time_s"]
    # the reads of mapped files say nothing of how the job reads: their data comes through the mapping
    plain = {p: d for p, d in touched.items() if not _mapped_in(d)}
    small = sum(d["small_reads"] for d in plain.values())
    containers = {p for p in read_files if container_file(p)}
    window = _read_window_s(rows)
    return {
        **_volumes(tot, touched, read_files),
        "read_size_histogram": _read_size_histogram(rows),
        "eof_reads": int(sum(d["eof_reads"] for d in touched.values())),
        # read calls, and the small ones, on files not mapped, reads at end of file left out
        "plain_reads": int(sum(d["reads"] - d["eof_reads"] for d in plain.values())),
        "plain_small_reads": int(small),
        "container_files": len(containers),
        "container_small_reads": int(sum(d["small_reads"] for p, d in plain.items() if p in containers)),
        "file_size_median_bytes": int(_median(sizes)),
        "meta_time_fraction": round(tot["meta_time_s"] / io_time, 4) if io_time > 0 else 0.0,
        "bandwidth_read_window_bytes_per_s": round(tot["bytes_read"] / window, 1) if window > 0 else 0.0,
        "read_window_s": round(window, 6),
        "reference_bandwidth": {"bytes_per_s": round(ref[0], 1), "source": ref[1]} if ref else {},
        "data_wait": _data_wait(st, tot),
        "staging": _staging(read_files, ref),
        "mapped": _mapped_section({p: d for p, d in touched.items() if _mapped_in(d)}),
        "time_base_s": round(base_s, 6),
    }


def _training_data_doc(view: dict[str, Any], left_out: dict[str, int]) -> dict[str, Any]:
    """The section's account of what the I/O findings looked at, and what they left out."""
    return {
        "files_read": view["files_read"],
        "bytes_read": view["bytes_read"],
        "reads": view["reads"],
        "small_reads": view["plain_small_reads"],
        "eof_reads": view["eof_reads"],
        "read_time_s": view["read_time_s"],
        "meta_time_s": view["meta_time_s"],
        "container_files": view["container_files"],
        "left_out_files": left_out,
    }


def _findings(run: Run, view: dict[str, Any], st: Any) -> list[Finding]:
    """small_file_io and io_bandwidth; else the staging advice as a finding of its own. All from the
    data the training reads (``view``: :func:`_data_view`)."""
    hpc = _from_hpc_log(run)
    findings = [f for f in (_small_file_io(view, st, hpc), _io_bandwidth(view, st, hpc)) if f is not None]
    if not findings:
        staging_finding = _staging_finding(view, st, hpc)
        if staging_finding is not None:
            findings.append(staging_finding)
    return findings


def _section(
    run: Run, ctx: dict[str, Any], rows: list[FileRow], by_module: dict[str, dict[str, int]], st: Any
) -> dict[str, Any]:
    """The section's document from the files' last snapshots (those that did I/O or stat calls)."""
    roles = _roles(run)
    tot = _totals(rows)
    hist = _read_size_histogram(rows)
    touched, read_files = _files_used(run, ctx, rows)
    sizes = [d["extent"] for d in read_files.values()]
    start_ns, end_ns = _run_bounds(run, ctx)
    ref = _reference_bandwidth(run, read_files)
    io_time = tot["read_time_s"] + tot["write_time_s"] + tot["meta_time_s"]
    eof = sum(eof_reads(f) for f in rows)
    small_reads = sum(hist[b] for b in SMALL_READ_BUCKETS) - eof
    return {
        "layers": sorted({f.layer for f in rows}),
        "by_module": by_module,
        **_volumes(tot, touched, read_files),
        **_bandwidths(rows, tot, start_ns, end_ns),
        "read_size_histogram": hist,
        "small_read_fraction": round(small_reads / (tot["reads"] - eof), 4) if tot["reads"] > eof else 0.0,
        "eof_reads": int(eof),
        "file_size_histogram": _file_size_histogram(sizes),
        "file_size_median_bytes": int(_median(sizes)),
        "seq_read_fraction": round(sum(d["seq_reads"] for d in touched.values()) / tot["reads"], 4)
        if tot["reads"]
        else 0.0,
        "meta_time_fraction": round(tot["meta_time_s"] / io_time, 4) if io_time > 0 else 0.0,
        "bandwidth_timeline": _time_series(run, ctx, start_ns) if start_ns else [],
        "by_role": _by_role(rows, roles),
        "by_phase_note": "I/O counters are kept per process, not per phase: see by_role (main loop, "
        "dataloader_worker, rank)",
        "reference_bandwidth": {"bytes_per_s": round(ref[0], 1), "source": ref[1]} if ref else {},
        "data_wait": _data_wait(st, tot),
        "staging": _staging(read_files, ref),
        "mapped": _mapped_section({p: d for p, d in touched.items() if _mapped_in(d)}),
        "files_detail": _files_detail(touched),
    }


def _totals(rows: list[FileRow]) -> dict[str, float]:
    """Bytes, operations and the time in read, write and metadata calls, over all the rows."""
    tot = {k: sum(f.v[k] for f in rows) for k in ("bytes_read", "bytes_written", "reads", "writes", "opens")}
    for k in ("read_time_s", "write_time_s", "meta_time_s"):
        tot[k] = sum(f.v[k] for f in rows)
    return tot


def _read_size_histogram(rows: list[FileRow]) -> dict[str, int]:
    """Reads per Darshan size bucket, over all the rows."""
    hist = {name: 0 for name, _, _ in model.DARSHAN_SIZE_BUCKETS}
    for f in rows:
        for (name, _, _), n in zip(model.DARSHAN_SIZE_BUCKETS, f.size_read, strict=True):
            hist[name] += n
    return hist


#: The per-path sums of the counters of the same name.
_PATH_SUMS = (
    "bytes_read",
    "bytes_written",
    "reads",
    "writes",
    "opens",
    "seq_reads",
    "read_time_s",
    "meta_time_s",
    *_MAPPED_SUMS,
)


def _new_path_sums() -> dict[str, float]:
    return {
        "bytes_read": 0.0,
        "bytes_written": 0.0,
        "reads": 0.0,
        "writes": 0.0,
        "opens": 0.0,
        "seq_reads": 0.0,
        "read_time_s": 0.0,
        "meta_time_s": 0.0,
        "extent": 0.0,
        "processes": 0.0,
        "small_reads": 0.0,
        "pages": 0.0,
        "eof_reads": 0.0,
        **{k: 0.0 for k in _MAPPED_SUMS},
    }


def eof_reads(f: FileRow) -> int:
    """The reads of ``f`` taken for reads at end of file, which return 0 bytes: one read of the
    smallest size bucket (0-100 bytes) per open at most. Reading a file to its end takes one more read
    call that returns nothing (Python's ``f.read()``, ``while chunk := f.read(n)``); the counters put
    it among the smallest reads, but it moves no data and is no small read."""
    return int(min(f.v["opens"], f.size_read[0])) if f.v["reads"] else 0


def _per_path(rows: list[FileRow]) -> dict[str, dict[str, float]]:
    """Per path, over processes: the counters summed, the processes, the small reads (reads at end of
    file left out), those reads at end of file and the extent (the largest offset touched plus one)."""
    per: dict[str, dict[str, float]] = {}
    for f in rows:
        d = per.setdefault(f.path, _new_path_sums())
        for k in _PATH_SUMS:
            d[k] += f.v[k]
        d["processes"] += 1
        eof = eof_reads(f)
        d["small_reads"] += sum(f.size_read[i] for i in _SMALL_READ_INDEX) - eof
        d["eof_reads"] += eof
        ext = (
            max(f.v["max_byte_read"], f.v["max_byte_written"], f.v["max_byte_mapped"]) + 1
            if _touched(f)
            else 0
        )
        d["extent"] = max(d["extent"], ext)
    return per


def _files_detail(touched: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """The :data:`TOP_FILES` files with the most bytes read, written and mapped in, largest first."""
    ranked = sorted(
        touched.items(),
        key=lambda kv: (-(kv[1]["bytes_read"] + kv[1]["bytes_written"] + _mapped_bytes(kv[1])), kv[0]),
    )
    return [
        {
            "path": p,
            "bytes_read": int(d["bytes_read"]),
            "bytes_written": int(d["bytes_written"]),
            "reads": int(d["reads"]),
            "writes": int(d["writes"]),
            "opens": int(d["opens"]),
            "seq_read_fraction": round(d["seq_reads"] / d["reads"], 4) if d["reads"] else 0.0,
            "read_time_s": round(d["read_time_s"], 6),
            "processes": int(d["processes"]),
            **_mapped_doc(d),
        }
        for p, d in ranked[:TOP_FILES]
    ]


def _file_size_histogram(sizes: list[float]) -> dict[str, int]:
    size_hist = {name: 0 for name, _, _ in model.DARSHAN_SIZE_BUCKETS}
    for s in sizes:
        size_hist[_size_bucket(s)] += 1
    return size_hist


def _volumes(
    tot: dict[str, float], touched: dict[str, dict[str, float]], read_files: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The section's totals: bytes, files, operations and the time in calls."""
    return {
        "bytes_read": int(tot["bytes_read"]),
        "bytes_written": int(tot["bytes_written"]),
        "files": len(touched),
        "files_read": len(read_files),
        "reads": int(tot["reads"]),
        "writes": int(tot["writes"]),
        "opens": int(tot["opens"]),
        "read_time_s": round(tot["read_time_s"], 6),
        "write_time_s": round(tot["write_time_s"], 6),
        "meta_time_s": round(tot["meta_time_s"], 6),
    }


def _run_bounds(run: Run, ctx: dict[str, Any]) -> tuple[int, int]:
    """The run's start and end (ns): the manifest's, else the first and last snapshot times."""
    m = run.manifest
    start_ns = int(m.get("start_ns") or 0)
    end_ns = int(m.get("end_ns") or 0)
    if not start_ns or not end_ns:
        ((lo, hi),) = aggregate(run, ctx, _BOUNDS)
        start_ns = start_ns or int(lo)
        end_ns = end_ns or int(hi)
    return start_ns, end_ns


def _read_window_s(rows: list[FileRow]) -> float:
    """From the first read to the last, over all the files."""
    starts = [f.v["read_start"] for f in rows if f.v["read_start"] > 0]
    ends = [f.v["read_end"] for f in rows if f.v["read_end"] > 0]
    return (max(ends) - min(starts)) if starts and ends and max(ends) > min(starts) else 0.0


def _bandwidths(rows: list[FileRow], tot: dict[str, float], start_ns: int, end_ns: int) -> dict[str, Any]:
    """The read bandwidth while in read calls, while reading (the read window) and over the run; the
    write bandwidth while in write calls and over the run."""
    read_t, write_t = tot["read_time_s"], tot["write_time_s"]
    window_s = _read_window_s(rows)
    wall_s = max(0.0, (end_ns - start_ns) / NS)
    bw_read = tot["bytes_read"] / read_t if read_t > 0 else 0.0
    bw_window = tot["bytes_read"] / window_s if window_s > 0 else 0.0
    bw_wall = tot["bytes_read"] / wall_s if wall_s > 0 else 0.0
    return {
        "bandwidth_read_bytes_per_s": round(bw_read, 1),
        "bandwidth_read_window_bytes_per_s": round(bw_window, 1),
        "bandwidth_read_wall_bytes_per_s": round(bw_wall, 1),
        "read_window_s": round(window_s, 6),
        "bandwidth_write_bytes_per_s": round(tot["bytes_written"] / write_t if write_t > 0 else 0.0, 1),
        "bandwidth_write_wall_bytes_per_s": round(tot["bytes_written"] / wall_s if wall_s > 0 else 0.0, 1),
    }


#: The per-role sums of the counters of the same name (and the bytes brought in through mappings).
_ROLE_SUMS = (
    "bytes_read",
    "bytes_written",
    "reads",
    "writes",
    "read_time_s",
    "meta_time_s",
    "bytes_mapped_in",
)


def _by_role(rows: list[FileRow], roles: dict[tuple[str, int], str]) -> dict[str, dict[str, Any]]:
    """Totals per process role, most bytes read first (counters are per process: "by phase" is per
    role)."""
    by_role: dict[str, dict[str, float]] = {}
    procs: dict[str, set[tuple[str, int]]] = {}
    for f in rows:
        # no processes row: a process without an agent (its native dump), or Darshan's shared records
        role = roles.get((f.host, f.pid), "untraced" if f.pid >= 0 else "shared")
        r = by_role.setdefault(role, {k: 0.0 for k in _ROLE_SUMS})
        for k in _ROLE_SUMS[:-1]:
            r[k] += f.v[k]
        r["bytes_mapped_in"] += _process_pages(f.v) if f.module == "POSIX" else 0.0
        procs.setdefault(role, set()).add((f.host, f.pid))
    return {
        role: {
            **{k: (round(v, 6) if k.endswith("_s") else int(v)) for k, v in r.items()},
            "processes": len(procs[role]),
        }
        for role, r in sorted(by_role.items(), key=lambda kv: -kv[1]["bytes_read"])
    }


def _reference_bandwidth(run: Run, read_files: dict[str, dict[str, float]]) -> tuple[float, str] | None:
    """The reference read bandwidth and its source: iobench results, else the best single file of
    this run."""
    ref = _iobench_reference(run)
    best_file: tuple[float, str] | None = None
    for p, d in read_files.items():
        if d["bytes_read"] >= REFERENCE_MIN_BYTES and d["read_time_s"] > 0:
            bw = d["bytes_read"] / d["read_time_s"]
            if best_file is None or bw > best_file[0]:
                best_file = (bw, p)
    if ref is None and best_file is not None:
        ref = (best_file[0], f"best single-file read bandwidth in this run ({best_file[1]})")
    return ref


def _data_wait(st: Any, tot: dict[str, float]) -> dict[str, Any]:
    """The training loop's data wait beside the time the job spent in read and metadata calls."""
    if st is None or not st.count:
        return {}
    read_meta = tot["read_time_s"] + tot["meta_time_s"]
    ph = st.phases["data_wait"]
    return {
        "fraction": round(ph.fraction, 4),
        "total_s": round(ph.total_s, 6),
        "io_read_and_meta_time_s": round(read_meta, 6),
        "io_time_vs_data_wait": round(read_meta / ph.total_s, 4) if ph.total_s > 0 else 0.0,
    }


def _mapped_doc(d: dict[str, float]) -> dict[str, Any]:
    """A file's mappings: how many, the bytes mapped, the bytes of them brought in summed over the
    mappings and processes (resident pages, measured when a mapping goes; None where no mapping of the
    file was measured), and as distinct pages of the file (``bytes_brought_in``)."""
    measured = d["mmaps_measured"] or d["bytes_mapped_resident"] or not d["mmaps"]
    return {
        "mmaps": int(d["mmaps"]),
        "bytes_mapped": int(d["bytes_mapped"]),
        "bytes_mapped_resident": int(d["bytes_mapped_resident"]) if measured else None,
        "mmaps_measured": int(d["mmaps_measured"]),
        **({"bytes_brought_in": int(_mapped_bytes(d)) if measured else None} if "pages" in d else {}),
    }


def _mapped_section(mapped: dict[str, dict[str, float]]) -> dict[str, Any]:
    """All mapped files: totals, and the read calls made on them (their data comes through the
    mapping, so their sizes say nothing about how the job reads)."""
    if not mapped:
        return {}
    tot = {
        k: sum(d[k] for d in mapped.values()) for k in (*_MAPPED_SUMS, "reads", "small_reads", "eof_reads")
    }
    return {
        "files": len(mapped),
        **_mapped_doc(tot),
        "bytes_brought_in": int(sum(_mapped_bytes(d) for d in mapped.values())),
        "bytes_brought_in_exact": all(d["mmaps_measured"] >= d["mmaps"] for d in mapped.values()),
        "reads": int(tot["reads"]),
        "small_reads": int(tot["small_reads"]),
        "eof_reads": int(tot["eof_reads"]),
    }


def _staging(read_files: dict[str, dict[str, float]], ref: tuple[float, str] | None) -> list[dict[str, Any]]:
    """Directories to copy to a faster tier, by the time their reads took, with the expected gain."""
    dirs: dict[str, dict[str, float]] = {}
    for p, d in read_files.items():
        g = dirs.setdefault(os.path.dirname(p) or "/", {"files": 0, "bytes": 0.0, "time_s": 0.0, "size": 0.0})
        g["files"] += 1
        g["bytes"] += d["bytes_read"]
        g["time_s"] += d["read_time_s"] + d["meta_time_s"]
        g["size"] += d["extent"]
    out = []
    for path, g in sorted(dirs.items(), key=lambda kv: -kv[1]["time_s"])[:TOP_DIRS]:
        item: dict[str, Any] = {
            "directory": path,
            "files": int(g["files"]),
            "bytes_read": int(g["bytes"]),
            "size_bytes": int(g["size"]),
            "read_and_meta_time_s": round(g["time_s"], 6),
        }
        if ref is not None and ref[0] > 0:
            at_ref = g["bytes"] / ref[0]
            item["time_at_reference_s"] = round(at_ref, 6)
            item["expected_saving_s"] = round(max(0.0, g["time_s"] - at_ref), 6)
        out.append(item)
    return out


def _data_wait_fraction(st: Any) -> float:
    if st is None or not getattr(st, "count", 0):
        return 0.0
    return float(st.phases["data_wait"].fraction)


def _time_share(seconds: float, view: dict[str, Any], st: Any) -> float:
    """The share of the job's time that ``seconds`` of I/O calls can cost it, an upper bound of what a
    fix saves: for a training loop, of its step time, and never more than the loop waits for data
    (I/O it does not wait for costs it nothing); without one, of its processes' time
    (``time_base_s``)."""
    if st is not None and st.count:
        total = float(st.total_s)
        return round(min(_data_wait_fraction(st), seconds / total), 4) if total > 0 else 0.0
    base = float(view.get("time_base_s") or 0.0)
    return round(min(1.0, seconds / base), 4) if base > 0 else 0.0


def _gain(view: dict[str, Any], st: Any) -> float:
    """Upper bound on the share of the job's time the fix can save: its read and metadata time."""
    return _time_share(view["read_time_s"] + view["meta_time_s"], view, st)


def _from_hpc_log(run: Run) -> bool:
    """The run is an imported Darshan log: its findings speak of the job's ranks and its file system,
    not of a DataLoader or of the machine that reads the log."""
    source = run.manifest.get("source")
    return (
        run.manifest.get("status") == "imported"
        and isinstance(source, dict)
        and source.get("format") == "darshan"
    )


def _small_file_io(view: dict[str, Any], st: Any, hpc: bool = False) -> Finding | None:
    n = view["files_read"]
    median = view["file_size_median_bytes"]
    # reads of mapped files are left out of the share (their data comes through the mapping), and so are
    # the reads at end of file (they return nothing)
    reads = view["plain_reads"]
    small = view["plain_small_reads"]
    small_share = round(small / reads, 4) if reads > 0 else 0.0
    many_small = n >= SMALL_FILES_MIN and median < SMALL_FILE_BYTES
    small_reads = reads > 0 and small_share >= SMALL_READ_SHARE
    if not (many_small or small_reads):
        return None
    evidence: dict[str, Any] = {
        "files_read": n,
        "file_size_median_bytes": median,
        "reads": view["reads"],
        "eof_reads": view["eof_reads"],
        "small_read_fraction": small_share,
        "read_time_s": view["read_time_s"],
        "meta_time_s": view["meta_time_s"],
        "meta_time_fraction": view["meta_time_fraction"],
    }
    # small reads of files that already pack many samples: sharding is done, the reading is not
    sharded = view["container_files"] > 0 and (
        view["container_small_reads"] >= 0.5 * small if small_reads else view["container_files"] >= 0.5 * n
    )
    if sharded:
        evidence["container_files"] = view["container_files"]
    for key in ("mapped", "data_wait", "staging"):
        if view[key]:
            evidence[key] = view[key][:3] if key == "staging" else view[key]
    why = (
        f"{n} files read with a median size of {median / KiB:.0f} KiB"
        if many_small
        else f"{100 * small_share:.0f}% of the reads are smaller than {SMALL_READ_BYTES // KiB} KiB"
    )
    gain = _gain(view, st)
    return Finding(
        id="small_file_io",
        severity=severity_of_gain(gain),
        title=f"small-file I/O: {why}; {view['read_time_s'] + view['meta_time_s']:.2f} s in reads and metadata",
        evidence=evidence,
        recommendation=_small_file_fix(view, st, hpc, sharded),
        estimated_gain=gain,
        threshold={
            "files_min": SMALL_FILES_MIN,
            "median_file_bytes_below": SMALL_FILE_BYTES,
            "small_read_share": SMALL_READ_SHARE,
            "small_read_bytes_below": SMALL_READ_BYTES,
        },
    )


def _small_file_fix(view: dict[str, Any], st: Any, hpc: bool, sharded: bool) -> str:
    if hpc:
        return (
            "gather the application's data into a few large files (HDF5, NetCDF, ADIOS, or one shared file "
            "through MPI-IO) and access them in blocks of 1 MiB or more; let the job's ranks combine small "
            "accesses (MPI-IO collective I/O, fewer aggregator ranks) and stage hot inputs on a faster tier "
            "(burst buffer, node-local NVMe) — see the staging evidence."
        )
    link = ""
    if view["data_wait"] and _data_wait_fraction(st) >= DATA_WAIT_LINK:
        io_explains = float(view["data_wait"].get("io_time_vs_data_wait", 0.0))
        link = (
            f" The training loop waits for data {100 * _data_wait_fraction(st):.0f}% of each step, and I/O "
            f"read+open time is {100 * io_explains:.0f}% of that waiting."
        )
    if sharded:
        return (
            f"the data is already packed in {view['container_files']} shard or container files (tar / "
            "WebDataset, Arrow, Parquet, TFRecord, HDF5, ...): the small reads come from how they are read. "
            "Read each shard sequentially through a large buffer (open(path, 'rb', buffering=1 << 20), "
            "tarfile in stream mode 'r|*', whole-shard reads) or memory-map it (Arrow, NumPy) instead of "
            "many small read calls; use more DataLoader workers (num_workers) so that what remains overlaps "
            "compute, and stage the shards on a fast tier (/dev/shm, local NVMe) — see the staging "
            "evidence." + link
        )
    return (
        "pack the samples into a few large shards (tar / WebDataset, TFRecord, one .npy per shard) and "
        "read them sequentially in blocks of 1 MiB or more; until then use more DataLoader workers "
        "(num_workers) so that opens and small reads overlap, and stage the dataset on a fast tier "
        "(/dev/shm, local NVMe) — see the staging evidence." + link
    )


def _io_bandwidth(view: dict[str, Any], st: Any, hpc: bool = False) -> Finding | None:
    ref = view["reference_bandwidth"]
    achieved = view["bandwidth_read_window_bytes_per_s"]
    if not ref or view["bytes_read"] < BANDWIDTH_MIN_BYTES or achieved <= 0:
        return None
    if view["mapped"].get("bytes_brought_in", 0) > view["bytes_read"]:
        return None  # most data comes through mappings, which the read-call bandwidth does not see
    ratio = achieved / ref["bytes_per_s"]
    if ratio >= BANDWIDTH_RATIO:
        return None
    io_explains = float(view["data_wait"].get("io_time_vs_data_wait", 0.0)) if view["data_wait"] else 0.0
    if view["data_wait"] and (_data_wait_fraction(st) < DATA_WAIT_LINK or io_explains < IO_SHARE_OF_WAIT_MIN):
        return None  # the loop does not wait for I/O: reading slowly is not what limits it
    evidence: dict[str, Any] = {
        "achieved_read_bytes_per_s": achieved,
        "reference_read_bytes_per_s": ref["bytes_per_s"],
        "reference": ref["source"],
        "ratio": round(ratio, 4),
        "bytes_read": view["bytes_read"],
        "read_window_s": view["read_window_s"],
    }
    if view["data_wait"]:
        evidence["data_wait"] = view["data_wait"]
    if view["staging"]:
        evidence["staging"] = view["staging"][:3]
    gain = _gain(view, st)
    return Finding(
        id="io_bandwidth",
        severity=severity_of_gain(gain),
        title=(
            f"read bandwidth: the job read at {achieved / MiB:.1f} MiB/s, {100 * ratio:.0f}% of the "
            f"{ref['bytes_per_s'] / MiB:.0f} MiB/s "
            + ("that it reached on its fastest file" if hpc else "measured on this machine")
        ),
        evidence=evidence,
        recommendation=(
            "read with more parallelism across the job's ranks (MPI-IO collective reads, more readers per "
            "file), in larger sequential blocks, and stage the hottest directories on a faster tier (burst "
            "buffer, node-local NVMe) — see the staging evidence; measure the file system the job used with "
            "`holoprof iobench PATH` on that system"
            if hpc
            else "read with more parallelism (more DataLoader workers, several files in flight), in larger "
            "sequential blocks, and stage the hottest directories on a faster tier (/dev/shm, local NVMe) "
            "— see the staging evidence; measure the device with `holoprof iobench PATH`"
        ),
        estimated_gain=gain,
        threshold={
            "ratio_below": BANDWIDTH_RATIO,
            "min_bytes_read": BANDWIDTH_MIN_BYTES,
            "data_wait_fraction_min": DATA_WAIT_LINK,
            "io_share_of_data_wait_min": IO_SHARE_OF_WAIT_MIN,
        },
    )


def _staging_finding(view: dict[str, Any], st: Any, hpc: bool = False) -> Finding | None:
    """The directories whose reads would gain most from a faster tier; the saving estimated by
    reading their bytes at the reference bandwidth is its gain."""
    items = [s for s in view["staging"] if s.get("expected_saving_s", 0) > 0]
    total = view["read_time_s"] + view["meta_time_s"]
    saving = sum(s["expected_saving_s"] for s in items[:3])
    if not items or total <= 0 or saving < 0.5 * total or saving < 1.0:
        return None
    gain = _time_share(saving, view, st)
    return Finding(
        id="io_bandwidth",
        severity=severity_of_gain(gain),
        title=f"staging: copying {len(items[:3])} directories to a faster tier would save about {saving:.1f} s of reads",
        evidence={
            "staging": items[:3],
            "reference": view["reference_bandwidth"].get("source"),
            "read_and_meta_time_s": round(total, 6),
        },
        recommendation=(
            "stage these directories on a burst buffer or node-local NVMe before the job runs and read them there"
            if hpc
            else "copy these directories to /dev/shm or local NVMe before training and read them there"
        ),
        estimated_gain=gain,
        threshold={"saving_share_min": 0.5, "saving_s_min": 1.0},
    )

"""The execution model: table schemas, span kinds, phase names, environment variables.

Everything that collectors write and analyses read is named here. The names are a contract with the
run directory format, the JSON report and the docs (``docs/data-model.md``): add, never rename.

This module must stay importable with the standard library only: the in-process agent imports it at
interpreter start-up in every process of a job. The Arrow schemas are therefore built lazily by
:func:`arrow_schema`.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (it loads re: milliseconds)
if TYPE_CHECKING:
    from typing import Final, Literal

SCHEMA_VERSION: Final = 1

#: ``holoprof run --memory`` modes of the memory collector: sampled steps (default), every step, off
MEMORY_MODES: tuple[str, ...] = ("sampled", "full", "off")
REPORT_SCHEMA: Final = "holoprof.report/1"
#: The report's JSON Schema, shipped with the package (checked against every report the tests make).
REPORT_SCHEMA_FILE: Final = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "schema", "report.schema.json"
)

#: A training thread's batch waits read the CPU clocks and the run queue on its first READ_ALL waits,
#: then on the first two of every READ_EVERY (``wait_n`` in their attributes): the input model weighs
#: each of those later readings by the waits it stands for. The loader's ``dataloader`` span says the
#: READ_EVERY its run used (``read_every``); runs recorded before it did read 2 in every
#: BATCH_WAITS_READ_EVERY_UNSAID.
BATCH_WAITS_READ_ALL: Final = 64
BATCH_WAITS_READ_EVERY: Final = 32
BATCH_WAITS_READ_EVERY_UNSAID: Final = 8

# --- span kinds ------------------------------------------------------------------------------------
if TYPE_CHECKING:
    SpanKind = Literal["stage", "epoch", "step", "phase", "op", "io", "comm", "checkpoint", "user"]
SPAN_KINDS: Final[tuple[str, ...]] = (
    "stage",
    "epoch",
    "step",
    "phase",
    "op",
    "io",
    "comm",
    "checkpoint",
    "user",
)

# --- standard phases ---------------------------------------------------------------------------------
if TYPE_CHECKING:
    PhaseName = Literal[
        "data_wait",
        "forward",
        "backward",
        "optimizer",
        "compute",
        "compile",
        "communication",
        "checkpoint",
        "eval",
        "other",
    ]
#: ``compute`` is forward + backward + optimizer run as one fused call that cannot be told apart from
#: outside (a compiled Keras/TensorFlow train step); frameworks that can split them never record it.
#: ``compile`` is ``torch.compile``'s compilation, cut out of the phase it ran in (the first forward,
#: the first backward).
PHASES: Final[tuple[str, ...]] = (
    "data_wait",
    "forward",
    "backward",
    "optimizer",
    "compute",
    "compile",
    "communication",
    "checkpoint",
    "eval",
    "other",
)
#: Phases that collectors record; ``other`` is always the remainder of the step.
MEASURED_PHASES: Final[tuple[str, ...]] = tuple(p for p in PHASES if p != "other")

# --- finding ids -------------------------------------------------------------------------------------
FINDING_IDS: Final[tuple[str, ...]] = (
    "input_bound",
    "small_file_io",
    "io_bandwidth",
    "checkpoint_bound",
    "communication_bound",
    "straggler",
    "memory_pressure",
    "memory_headroom",
    "low_device_utilization",
    "host_overhead",
    "hang",
    "low_mfu",
    "graph_breaks",
    "recompiles",
)
if TYPE_CHECKING:
    Severity = Literal["high", "medium", "low"]

# --- process roles -----------------------------------------------------------------------------------
ROLES: Final[tuple[str, ...]] = (
    "launcher",  # the `holoprof run` process itself (it samples resources of the whole job)
    "main",  # the command started by `holoprof run`, or the process that called holoprof.start()
    "rank",  # a torch.distributed rank (RANK set, or init_process_group called)
    "dataloader_worker",  # a torch DataLoader worker
    "forkserver",  # the multiprocessing fork server
    "child",  # any other process of the job
)

# --- environment variables (the launcher sets them; the agent reads them) --------------------------
ENV_RUN_DIR: Final = "HOLOPROF_RUN_DIR"  # the gate: no agent starts unless it is set
ENV_OPTIONS: Final = "HOLOPROF_OPTIONS"  # JSON object of agent options
ENV_LAUNCHER_PID: Final = "HOLOPROF_LAUNCHER_PID"  # pid of `holoprof run`; its direct child is "main"
ENV_BOOT_DIR: Final = "HOLOPROF_BOOT_DIR"  # the directory holding our sitecustomize (for chaining)
#: set by a traced process to its pid while a DataLoader starts its workers (empty otherwise): a
#: worker started with "spawn" installs only the collectors a worker needs (collect.torch.worker)
ENV_LOADER_WORKERS: Final = "HOLOPROF_LOADER_WORKERS"
#: seconds at most such a worker holds its first flush while it starts (collect.startup; default 10):
#: more where its start-up takes longer (a slow file system, a run under valgrind)
ENV_LOADER_HOLD: Final = "HOLOPROF_LOADER_HOLD_S"
#: tests: "<collector>[:<entry point>]" makes that collector raise there (agent.core.fault_point)
ENV_FAULT: Final = "HOLOPROF_FAULT_INJECT"

# --- processes table ----------------------------------------------------------------------------------
#: the ``info`` of a row the resource sampler wrote for a process it saw (an agent's own row says more);
#: where a process has both, its view keeps the agent's (store.reader's SQL, store.process_rows)
SAMPLER_MARK: Final = '"source": "sampler"'
SAMPLER_INFO: Final = "{" + SAMPLER_MARK + "}"


def sampler_row(info: str | None) -> bool:
    """Whether a ``processes`` row's ``info`` is the resource sampler's (not an agent's)."""
    return info is not None and SAMPLER_MARK in info


# --- run directory layout ----------------------------------------------------------------------------
MANIFEST: Final = "manifest.json"
CONTROL_DIR: Final = "control"
ARTIFACTS_DIR: Final = "artifacts"
#: one file per launcher of a run that several launchers joined (``holoprof run --join``)
HOSTS_DIR: Final = "hosts"
TABLES: Final[tuple[str, ...]] = ("spans", "samples", "io_files", "io_ops", "processes")
CHUNK_SUFFIX: Final = ".parquet"

# --- table columns -----------------------------------------------------------------------------------
# Identity columns carried by every data row (constant within a chunk, so they cost ~nothing in Parquet).
IDENTITY_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("host", "string"),
    ("pid", "int64"),
    ("rank", "int32"),  # -1 when the process is not a distributed rank
)

COLUMNS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "spans": (
        *IDENTITY_COLUMNS,
        ("tid", "int64"),
        ("span_id", "int64"),
        ("parent_id", "int64"),  # 0 = no parent
        ("kind", "string"),
        ("name", "string"),
        ("start_ns", "int64"),
        ("end_ns", "int64"),
        ("step", "int64"),  # index of the training step the span belongs to (-1: none)
        ("attrs", "string"),  # JSON object or null
    ),
    "samples": (
        *IDENTITY_COLUMNS,
        ("ts_ns", "int64"),
        ("name", "string"),
        ("value", "double"),
        ("target_pid", "int64"),  # the process measured; -1 = the whole job (sum over its process tree)
    ),
    "io_files": (
        *IDENTITY_COLUMNS,
        ("ts_ns", "int64"),  # snapshot time: rows are cumulative snapshots, the last one per file wins
        ("module", "string"),  # POSIX | STDIO
        ("layer", "string"),  # native | python | darshan
        ("path", "string"),
        ("counters", "string"),  # JSON object: Darshan counter name -> value (all of them)
        # JSON {"page_size", "pages": [[first page, count], ...]}: the distinct pages of a mapped file
        # the process brought in (native layer, its final counters); null otherwise
        ("mapped_pages", "string"),
    ),
    "io_ops": (
        *IDENTITY_COLUMNS,
        ("module", "string"),
        ("path", "string"),
        ("op", "string"),  # read | write | open | close | seek | stat | ...
        ("offset", "int64"),
        ("size_bytes", "int64"),
        ("start_ns", "int64"),
        ("end_ns", "int64"),
    ),
    "processes": (
        *IDENTITY_COLUMNS,
        ("ppid", "int64"),
        ("local_rank", "int32"),
        ("world_size", "int32"),
        ("role", "string"),
        ("argv", "string"),  # JSON list
        ("exe", "string"),
        ("start_ns", "int64"),
        ("end_ns", "int64"),  # 0 while running
        ("exit_code", "int32"),  # -1 unknown
        ("updated_ns", "int64"),  # rows are snapshots; the last one per (host, pid) wins
        ("clock_offset_ns", "int64"),  # wall-clock minus monotonic clock of this process
        ("versions", "string"),  # JSON: python, holoprof, torch, ...
        ("dropped_events", "int64"),
        ("errors", "string"),  # JSON list of "collector: message"
        ("info", "string"),  # JSON: collectors active, options, I/O layer, ...
        # JSON: the agent's exact counts, kept whatever spans are dropped: {"threads": {tid: {steps,
        # step_ns, first_ns, last_ns, epochs, phases: {name: [count, ns]}, outside: {...}}}}
        ("counters", "string"),
    ),
}


# Darshan's counters of the POSIX, STDIO and MPI-IO modules (as PyDarshan names them), one typed column
# each in ``io_files`` (null where a module has no such counter). ``counters`` keeps every counter as JSON, including any not listed here;
# a counter added here later reads as null in the files written before. Floats are the ``*_F_*``.
_POSIX_COUNTERS: Final = (
    "OPENS FILENOS DUPS READS WRITES SEEKS STATS MMAPS FSYNCS FDSYNCS RENAME_SOURCES RENAME_TARGETS "
    "RENAMED_FROM MODE BYTES_READ BYTES_WRITTEN MAX_BYTE_READ MAX_BYTE_WRITTEN CONSEC_READS CONSEC_WRITES "
    "SEQ_READS SEQ_WRITES RW_SWITCHES MEM_NOT_ALIGNED MEM_ALIGNMENT FILE_NOT_ALIGNED FILE_ALIGNMENT "
    "MAX_READ_TIME_SIZE MAX_WRITE_TIME_SIZE {sizes} STRIDE1_STRIDE STRIDE2_STRIDE STRIDE3_STRIDE "
    "STRIDE4_STRIDE STRIDE1_COUNT STRIDE2_COUNT STRIDE3_COUNT STRIDE4_COUNT ACCESS1_ACCESS ACCESS2_ACCESS "
    "ACCESS3_ACCESS ACCESS4_ACCESS ACCESS1_COUNT ACCESS2_COUNT ACCESS3_COUNT ACCESS4_COUNT FASTEST_RANK "
    "FASTEST_RANK_BYTES SLOWEST_RANK SLOWEST_RANK_BYTES F_OPEN_START_TIMESTAMP F_READ_START_TIMESTAMP "
    "F_WRITE_START_TIMESTAMP F_CLOSE_START_TIMESTAMP F_OPEN_END_TIMESTAMP F_READ_END_TIMESTAMP "
    "F_WRITE_END_TIMESTAMP F_CLOSE_END_TIMESTAMP F_READ_TIME F_WRITE_TIME F_META_TIME F_MAX_READ_TIME "
    "F_MAX_WRITE_TIME F_FASTEST_RANK_TIME F_SLOWEST_RANK_TIME F_VARIANCE_RANK_TIME F_VARIANCE_RANK_BYTES"
)
_STDIO_COUNTERS: Final = (
    "OPENS FDOPENS READS WRITES SEEKS FLUSHES BYTES_WRITTEN BYTES_READ MAX_BYTE_READ MAX_BYTE_WRITTEN "
    "FASTEST_RANK FASTEST_RANK_BYTES SLOWEST_RANK SLOWEST_RANK_BYTES F_META_TIME F_WRITE_TIME F_READ_TIME "
    "F_OPEN_START_TIMESTAMP F_CLOSE_START_TIMESTAMP F_WRITE_START_TIMESTAMP F_READ_START_TIMESTAMP "
    "F_OPEN_END_TIMESTAMP F_CLOSE_END_TIMESTAMP F_WRITE_END_TIMESTAMP F_READ_END_TIMESTAMP "
    "F_FASTEST_RANK_TIME F_SLOWEST_RANK_TIME F_VARIANCE_RANK_TIME F_VARIANCE_RANK_BYTES"
)

_MPIIO_COUNTERS: Final = (
    "INDEP_OPENS COLL_OPENS INDEP_READS INDEP_WRITES COLL_READS COLL_WRITES SPLIT_READS SPLIT_WRITES "
    "NB_READS NB_WRITES SYNCS HINTS VIEWS MODE BYTES_READ BYTES_WRITTEN RW_SWITCHES MAX_READ_TIME_SIZE "
    "MAX_WRITE_TIME_SIZE SIZE_READ_AGG_0_100 SIZE_READ_AGG_100_1K SIZE_READ_AGG_1K_10K "
    "SIZE_READ_AGG_10K_100K SIZE_READ_AGG_100K_1M SIZE_READ_AGG_1M_4M SIZE_READ_AGG_4M_10M "
    "SIZE_READ_AGG_10M_100M SIZE_READ_AGG_100M_1G SIZE_READ_AGG_1G_PLUS SIZE_WRITE_AGG_0_100 "
    "SIZE_WRITE_AGG_100_1K SIZE_WRITE_AGG_1K_10K SIZE_WRITE_AGG_10K_100K SIZE_WRITE_AGG_100K_1M "
    "SIZE_WRITE_AGG_1M_4M SIZE_WRITE_AGG_4M_10M SIZE_WRITE_AGG_10M_100M SIZE_WRITE_AGG_100M_1G "
    "SIZE_WRITE_AGG_1G_PLUS ACCESS1_ACCESS ACCESS2_ACCESS ACCESS3_ACCESS ACCESS4_ACCESS ACCESS1_COUNT "
    "ACCESS2_COUNT ACCESS3_COUNT ACCESS4_COUNT FASTEST_RANK FASTEST_RANK_BYTES SLOWEST_RANK "
    "SLOWEST_RANK_BYTES F_OPEN_START_TIMESTAMP F_READ_START_TIMESTAMP F_WRITE_START_TIMESTAMP "
    "F_CLOSE_START_TIMESTAMP F_OPEN_END_TIMESTAMP F_READ_END_TIMESTAMP F_WRITE_END_TIMESTAMP "
    "F_CLOSE_END_TIMESTAMP F_READ_TIME F_WRITE_TIME F_META_TIME F_MAX_READ_TIME F_MAX_WRITE_TIME "
    "F_FASTEST_RANK_TIME F_SLOWEST_RANK_TIME F_VARIANCE_RANK_TIME F_VARIANCE_RANK_BYTES"
)

#: holoprof's own counters of memory-mapped files (Darshan counts only POSIX_MMAPS): bytes mapped, the
#: largest offset mapped, and the pages brought in, measured when a mapping goes (see docs/io.md): summed
#: over the mappings (RESIDENT) and as distinct pages of the file over all of them (DISTINCT).
MAPPED_COUNTERS: Final = (
    "BYTES_MAPPED MAX_BYTE_MAPPED MMAPS_MEASURED BYTES_MAPPED_RESIDENT BYTES_MAPPED_DISTINCT"
)


def _darshan_counters() -> tuple[tuple[str, str], ...]:
    sizes = " ".join(f"SIZE_{rw}_{b}" for rw in ("READ", "WRITE") for b, _, _ in DARSHAN_SIZE_BUCKETS)
    names = [f"POSIX_{n}" for n in _POSIX_COUNTERS.format(sizes=sizes).split()]
    names += [f"STDIO_{n}" for n in _STDIO_COUNTERS.split()]
    names += [f"MPIIO_{n}" for n in _MPIIO_COUNTERS.split()]
    names += [f"POSIX_{n}" for n in MAPPED_COUNTERS.split()]
    return tuple((n, "double" if "_F_" in n else "int64") for n in names)


def column_names(table: str) -> tuple[str, ...]:
    return tuple(name for name, _ in COLUMNS[table])


def arrow_schema(table: str):  # -> pyarrow.Schema (lazy import: keep this module stdlib-only)
    import pyarrow as pa  # lazy: this module stays stdlib-only (the agent imports it in every process)

    types = {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(), "double": pa.float64()}
    return pa.schema(
        [pa.field(name, types[t]) for name, t in COLUMNS[table]],
        metadata={
            b"holoprof.schema_version": str(SCHEMA_VERSION).encode(),
            b"holoprof.table": table.encode(),
        },
    )


def duckdb_type(t: str) -> str:
    return {"string": "VARCHAR", "int64": "BIGINT", "int32": "INTEGER", "double": "DOUBLE"}[t]


# Darshan's ten access-size buckets (POSIX_SIZE_READ_0_100 ... POSIX_SIZE_READ_1G_PLUS).
DARSHAN_SIZE_BUCKETS: Final[tuple[tuple[str, int, int], ...]] = (
    ("0_100", 0, 100),
    ("100_1K", 100, 1024),
    ("1K_10K", 1024, 10 * 1024),
    ("10K_100K", 10 * 1024, 100 * 1024),
    ("100K_1M", 100 * 1024, 1024 * 1024),
    ("1M_4M", 1024 * 1024, 4 * 1024 * 1024),
    ("4M_10M", 4 * 1024 * 1024, 10 * 1024 * 1024),
    ("10M_100M", 10 * 1024 * 1024, 100 * 1024 * 1024),
    ("100M_1G", 100 * 1024 * 1024, 1024 * 1024 * 1024),
    ("1G_PLUS", 1024 * 1024 * 1024, 2**63 - 1),
)

#: (name, type) of every typed counter column of ``io_files``, after its other columns.
IO_COUNTERS: Final[tuple[tuple[str, str], ...]] = _darshan_counters()
COLUMNS["io_files"] = (*COLUMNS["io_files"], *IO_COUNTERS)


# --- files of a Python installation ----------------------------------------------------------------
#: Python source and bytecode: the interpreter reading the program itself (the script, its imports).
PYTHON_SOURCE_SUFFIXES: Final = (".py", ".pyc", ".pyi", ".pth")
#: Directories that only Python installations have.
_PYTHON_ENV_DIRS: Final = frozenset(("site-packages", "dist-packages", "__pycache__"))
_PYTHON_ENV_DIR_SUFFIXES: Final = (".dist-info", ".egg-info")


def python_env_path(path: str) -> bool:
    """A file of a Python installation, whichever interpreter it belongs to (a job's own virtual
    environment, a conda env, the system Python): under a ``site-packages``, ``dist-packages``,
    ``__pycache__``, ``*.dist-info`` or ``*.egg-info`` directory, in a standard library
    (``lib/pythonX.Y``, ``lib64/pythonX.Y``), a ``pyvenv.cfg``, or Python source and bytecode.
    The I/O collectors leave these files out (the native library applies the same rules:
    ``python_env_path`` in ``io_native/hp_paths.c``) and the I/O findings never take them for data."""
    if path.endswith(PYTHON_SOURCE_SUFFIXES) or path.endswith("/pyvenv.cfg"):
        return True
    prev = ""
    for c in path.split("/")[:-1]:
        if c in _PYTHON_ENV_DIRS or c.endswith(_PYTHON_ENV_DIR_SUFFIXES):
            return True
        if prev in ("lib", "lib64") and len(c) > 6 and c.startswith("python") and c[6].isdigit():
            return True
        prev = c
    return False

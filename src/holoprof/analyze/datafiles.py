"""Which files are the data the training reads: the rule every I/O finding applies to its evidence.

A job reads more than its data: its interpreter and packages, its launcher (``torchrun``,
``accelerate``), its tools' configuration (``~/.keras/keras.json``), the bookkeeping files of a
dataset library (Hugging Face ``datasets``' ``dataset_info.json``, ``state.json``, lock files). Those
reads are few, small and once: counted as data they make a job look like it reads small files, and
the advice (stage the virtual environment's ``bin`` on a fast tier) is absurd. The collectors already
leave out most of a Python installation (:func:`holoprof.model.python_env_path`); this module is the
analysis side of the same decision, for what still reaches a run (a launcher script, files of another
interpreter, tool configuration, imported logs).

:func:`not_data` names why a path is the job's environment rather than its data (None: data):

* ``system``: under :data:`SYSTEM_TREES` (``/usr``, ``/etc``, ``/proc``, ``/sys``, ``/dev``, ...);
* ``python``: a file of a Python installation (:func:`~holoprof.model.python_env_path`), or under the
  prefixes of the interpreter that analyses the run (``sys.prefix``, ``sys.base_prefix``, ...: the one
  that traced it when ``holoprof run`` prints its report);
* ``program``: a program or a shared library: a file directly in a ``bin`` or ``sbin`` directory (a
  launcher script such as ``venv/bin/torchrun``), or a ``.so`` file;
* ``configuration``: in a hidden directory where tools keep their configuration and caches: one
  directly in the home directory (``~/.keras/keras.json``, ``~/.config``, ``~/.cache``) or one of
  :data:`TOOL_DIRS` anywhere (a project's ``.git``), unless a directory below it holds datasets
  (``datasets``, ``datasets--*``: where Keras and Hugging Face keep downloaded data, which is the
  job's data). Other hidden directories (a project's ``.data/``) may well hold the data;
* ``bookkeeping``: a lock file (``*.lock``) or a dataset library's metadata file
  (:data:`BOOKKEEPING_NAMES`).

:func:`container_file` says whether a file already packs many samples (tar shards, Arrow, Parquet,
TFRecord, HDF5, ...): packing such files into shards is no advice.
"""

from __future__ import annotations

import os
import sys
from typing import Final

from holoprof.model import python_env_path

#: Trees of the operating system: never a job's data.
SYSTEM_TREES: Final = (
    "/usr",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/boot",
    "/snap",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/var/lib",
    "/var/cache",
)
#: Metadata files that dataset libraries write beside the data (Hugging Face ``datasets``).
BOOKKEEPING_NAMES: Final = frozenset(("dataset_info.json", "dataset_dict.json", "state.json"))
#: File names (lower case) of formats that already hold many samples per file.
CONTAINER_SUFFIXES: Final = (
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tar.xz",
    ".tar.zst",
    ".zip",
    ".arrow",
    ".parquet",
    ".feather",
    ".orc",
    ".avro",
    ".tfrecord",
    ".tfrecords",
    ".recordio",
    ".rec",
    ".h5",
    ".hdf5",
    ".nc",
    ".npz",
    ".lmdb",
    ".mdb",
    ".mds",
    ".msgpack",
    ".safetensors",
)
#: ... also when a shard number follows the format (``train.tfrecord-00001-of-00064``).
_CONTAINER_INFIXES: Final = (".tfrecord", ".arrow", ".parquet", ".tar")


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _interpreter_prefixes() -> tuple[str, ...]:
    out = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        if p and p != "/" and p not in out:
            out.append(os.path.abspath(p))
    return tuple(out)


_PREFIXES: Final = _interpreter_prefixes()


#: Hidden directories of tools, wherever they are (a project's ``.git``, a cache in a work directory).
TOOL_DIRS: Final = frozenset(
    (".git", ".hg", ".svn", ".cache", ".config", ".local", ".keras", ".ipython", ".jupyter", ".triton",
     ".nv", ".conda", ".venv", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".vscode",
     ".idea")
)  # fmt: skip
_HOME: Final = os.path.expanduser("~")


def _hidden_dir(parts: list[str]) -> bool:
    """Under a hidden directory of a tool (``~/.keras/...``, ``~/.cache/...``, ``proj/.git/...``), not in
    a dataset directory below it."""
    for i, c in enumerate(parts[:-1]):
        if c.startswith(".") and c not in (".", "..") and (c in TOOL_DIRS or "/".join(parts[:i]) == _HOME):
            return not any(d == "datasets" or d.startswith("datasets--") for d in parts[i + 1 : -1])
    return False


def not_data(path: str) -> str | None:
    """Why ``path`` is not the data the training reads (``system``, ``python``, ``program``,
    ``configuration``, ``bookkeeping``), or None when it is. A pure function of the path text."""
    if not path.startswith("/"):
        return None  # a relative or virtual name (an imported log's): nothing to go by
    if any(_under(path, t) for t in SYSTEM_TREES):
        return "system"
    if python_env_path(path) or any(_under(path, p) for p in _PREFIXES):
        return "python"
    parts = path.split("/")
    name = parts[-1]
    if (len(parts) > 2 and parts[-2] in ("bin", "sbin")) or name.endswith(".so") or ".so." in name:
        return "program"
    if _hidden_dir(parts):
        return "configuration"
    if name.endswith(".lock") or name in BOOKKEEPING_NAMES:
        return "bookkeeping"
    return None


def container_file(path: str) -> bool:
    """A file of a format that already packs many samples (tar / WebDataset shards, Arrow, Parquet,
    TFRecord, HDF5, NetCDF, LMDB, MosaicML shards, ...)."""
    name = os.path.basename(path).lower()
    return name.endswith(CONTAINER_SUFFIXES) or any(i + "-" in name for i in _CONTAINER_INFIXES)

"""The run directory: creation (private, 0700), the manifest, and locating runs."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from typing import Any

from holoprof import model
from holoprof._version import __version__
from holoprof.errors import HoloprofError, printable_text
from holoprof.store import safeio
from holoprof.store.raw import discard

DEFAULT_RUNS_DIR = "holoprof-runs"
#: a manifest is a few KiB; a larger one is refused (it is not one holoprof wrote)
MAX_MANIFEST_BYTES = 16 * 2**20


def default_run_dir(name: str, base: str = DEFAULT_RUNS_DIR) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "run"
    path = os.path.join(base, f"{stamp}-{safe}")
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(base, f"{stamp}-{safe}-{n}")
    return path


class RunExistsError(HoloprofError):
    """The run directory is taken: it holds files, or another launcher claimed it first."""


def create_run_dir(path: str) -> str:
    """Create ``path`` as a private run directory and claim it: the launcher that creates its
    ``control/`` folder (``mkdir``, atomic) owns the run, so of two launchers given the same directory
    at once exactly one goes on. Refuses a directory that exists and is not empty, or that another
    launcher claims first (:class:`RunExistsError`)."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise HoloprofError(
            f"--out {printable_text(path)} exists and is not a directory; choose a new directory for the run"
        )
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # an empty directory made beforehand is taken as it is
            if not os.path.isdir(path) or os.listdir(path):
                raise _taken(path)
        os.chmod(path, 0o700)
        try:
            os.mkdir(os.path.join(path, model.CONTROL_DIR), 0o700)
        except FileExistsError:
            raise _taken(path)
        os.makedirs(os.path.join(path, model.ARTIFACTS_DIR), mode=0o700, exist_ok=True)
        probe = os.path.join(path, ".write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise HoloprofError(
            f"cannot create the run directory {printable_text(path)} ({exc.strerror or exc}); choose a "
            "writable place with --out"
        )
    return path


def _taken(path: str) -> RunExistsError:
    """The refusal of a run directory that is taken (the one place that decides it)."""
    return RunExistsError(
        f"--out {printable_text(path)} already exists and is not empty (or another holoprof run "
        "started in it just now); choose a new directory (or leave out --out to get a fresh one under "
        "./holoprof-runs)"
    )


def make_run_dir(out: str | None, name: str) -> str:
    """:func:`create_run_dir` of ``out``, or of a fresh folder under ./holoprof-runs named after the
    time and ``name`` (the next free name when another launcher takes one at the same moment)."""
    if out:
        return create_run_dir(out)
    for _ in range(100):
        try:
            return create_run_dir(default_run_dir(name))
        except RunExistsError:
            continue
    return create_run_dir(default_run_dir(name))


#: Room kept at the end of the manifest written at the start of a run (trailing whitespace, which
#: JSON readers ignore), so that the launcher can still finish it in place on a full disk.
MANIFEST_RESERVE_BYTES = 4096


def write_manifest(run_dir: str, manifest: dict[str, Any], reserve: int = 0) -> None:
    """Write the manifest atomically (temporary file, then rename), followed by ``reserve`` bytes of
    whitespace. When that fails (a full disk), the existing manifest is overwritten in place if the
    new one fits in its size; otherwise the OSError is raised. No temporary file is left behind."""
    path = os.path.join(run_dir, model.MANIFEST)
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    tmp = path + f".tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data + b" " * reserve)
        os.replace(tmp, path)
    except OSError:
        discard(tmp)
        if not _overwrite_in_place(path, data):
            raise


def _overwrite_in_place(path: str, data: bytes) -> bool:
    """Write ``data`` over the file at ``path``, padded with spaces to its size, when it fits: its
    blocks are already allocated, so this needs no free space."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        if len(data) > size:
            return False
        view = memoryview(data + b" " * (size - len(data)))
        while view:
            view = view[os.write(fd, view) :]
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def new_manifest(command: list[str], name: str, options: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": model.SCHEMA_VERSION,
        "holoprof_version": __version__,
        "name": name,
        "command": command,
        "cwd": os.getcwd(),
        "hosts": [socket.gethostname()],
        "start_ns": time.time_ns(),
        "end_ns": None,
        "status": "running",
        "exit_code": None,
        "launcher_pid": os.getpid(),
        "options": options,
    }


#: the manifest's fields that commands read, and their JSON types (null is allowed for each)
_MANIFEST_FIELDS: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("schema_version", int, "an integer"),
    ("start_ns", int, "an integer"),
    ("end_ns", int, "an integer"),
    ("launcher_pid", int, "an integer"),
    ("exit_code", int, "an integer"),
    ("status", str, "a string"),
    ("name", str, "a string"),
    ("command", list, "a list"),
    ("hosts", list, "a list"),
    ("options", dict, "an object"),
)


def read_manifest(run_dir: str) -> dict[str, Any]:
    """Read and check the manifest of ``run_dir``; raise a HoloprofError naming the fix."""
    if not os.path.exists(run_dir):
        raise HoloprofError(
            f"{run_dir} does not exist; pass a run directory (runs are under ./holoprof-runs)"
        )
    if not os.path.isdir(run_dir):
        raise HoloprofError(f"{run_dir} is not a directory; pass a run directory made by `holoprof run`")
    path = os.path.join(run_dir, model.MANIFEST)
    if not os.path.exists(path):
        raise HoloprofError(
            f"{run_dir} is not a holoprof run (no {model.MANIFEST}); pass a directory made by `holoprof run` "
            "(runs are under ./holoprof-runs)"
        )
    try:
        data = safeio.read_json(path, MAX_MANIFEST_BYTES)
    except ValueError as exc:
        raise HoloprofError(
            f"{path} is corrupted ({exc}); restore it from a copy — the recorded data in {run_dir} is untouched"
        )
    except (safeio.NotRegularFile, safeio.FileTooLarge) as exc:
        raise HoloprofError(
            f"{path} is not a manifest ({exc.strerror}); restore it from a copy — the recorded data in "
            f"{run_dir} is untouched"
        )
    except OSError as exc:
        raise HoloprofError(f"cannot read {path} ({exc.strerror or exc}); check its permissions")
    if not isinstance(data, dict) or "schema_version" not in data:
        raise HoloprofError(
            f"{path} is not a holoprof manifest (no schema_version); restore it from a copy — the recorded "
            f"data in {run_dir} is untouched"
        )
    for key, kinds, what in _MANIFEST_FIELDS:
        v = data.get(key)
        if key in data and not (isinstance(v, kinds) and not isinstance(v, bool)) and v is not None:
            raise HoloprofError(
                f"{path} is corrupted ({key} is {json.dumps(v)[:40]}, not {what}); restore it from a copy — "
                f"the recorded data in {run_dir} is untouched"
            )
    if not isinstance(data["schema_version"], int):
        raise HoloprofError(
            f"{path} is corrupted (no schema_version); restore it from a copy — the recorded data in "
            f"{run_dir} is untouched"
        )
    if data["schema_version"] > model.SCHEMA_VERSION:
        raise HoloprofError(
            f"{run_dir} was written by a newer holoprof (schema {data['schema_version']}); upgrade holoprof "
            "to read it"
        )
    return data

"""The run directory: creation (private, 0700), the manifest, and locating runs."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import Any

from holoprof import model
from holoprof._version import __version__
from holoprof.errors import HoloprofError, printable_text
from holoprof.store import hosts, safeio
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


@dataclass(frozen=True)
class Claim:
    """A run directory this launcher may write: created by it, or ``joined`` (``--join``: it is one
    more host of a run another launcher created)."""

    path: str
    joined: bool = False


#: how long a joining launcher waits for the manifest of a run another launcher has just created
JOIN_WAIT_S = 30.0


def create_run_dir(path: str) -> str:
    """Create ``path`` as a private run directory and claim it (see :func:`claim_run_dir`)."""
    return claim_run_dir(path).path


def claim_run_dir(path: str, join: bool = False, multi_node: str | None = None) -> Claim:
    """Create ``path`` as a private run directory and claim it: the launcher that creates its
    ``control/`` folder (``mkdir``, atomic) owns the run, so of two launchers given the same directory
    at once exactly one goes on. Refuses a directory that exists and is not empty, or that another
    launcher claims first (:class:`RunExistsError`) — unless ``join``: then a run that another
    launcher created with ``--join`` is joined (see :func:`_taken`). ``multi_node`` says how this
    launcher looks like one of several (``torchrun --nnodes 2``), for the refusal's advice."""
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
            names = os.listdir(path) if os.path.isdir(path) else None
            if names is None or (names and not (join and model.CONTROL_DIR in names)):
                raise _refusal(path, multi_node)
        try:
            os.mkdir(os.path.join(path, model.CONTROL_DIR), 0o700)
        except FileExistsError:
            refusal = _taken(path, join, multi_node)
            if refusal is not None:
                raise refusal
            return Claim(path, joined=True)
        os.chmod(path, 0o700)
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
    return Claim(path)


def _taken(path: str, join: bool = False, multi_node: str | None = None) -> RunExistsError | None:
    """The refusal of a run directory that is taken (the one place that decides it), or None when
    this launcher joins it: with ``join``, a run that another launcher created with ``--join``, that
    still runs, of the same scheduler job."""
    shown = printable_text(path)
    manifest = _wait_for_manifest(path) if join else _manifest_or_none(path)
    if join:
        why = _not_joinable(manifest)
        if why is None:
            return None
        return RunExistsError(f"--out {shown} cannot be joined: {why}")
    ongoing = manifest is None or hosts.run_state(manifest)[0] == "running"
    if multi_node and ongoing:
        return RunExistsError(
            f"--out {shown} is already a run, and this looks like one node of a multi-node job "
            f"({multi_node}): add --join to every node's holoprof run so that each host joins the one run"
        )
    if (manifest or {}).get("join") and ongoing:
        return RunExistsError(
            f"--out {shown} is a run of several hosts (started with --join): add --join to join it as one "
            "more host, or choose a new directory"
        )
    also = (
        f"; this looks like one node of a multi-node job ({multi_node}): add --join to every node's "
        "holoprof run"
        if multi_node
        else ""
    )
    return RunExistsError(
        f"--out {shown} already exists and is not empty (or another holoprof run "
        "started in it just now); choose a new directory (or leave out --out to get a fresh one under "
        f"./holoprof-runs){also}"
    )


def _refusal(path: str, multi_node: str | None) -> RunExistsError:
    """:func:`_taken` for a launcher that does not join."""
    refusal = _taken(path, False, multi_node)
    assert refusal is not None
    return refusal


def _manifest_or_none(path: str) -> dict[str, Any] | None:
    try:
        return read_manifest(path)
    except HoloprofError:
        return None


def _wait_for_manifest(path: str) -> dict[str, Any] | None:
    """The manifest of a run another launcher is creating: it appears right after ``control/``."""
    deadline = time.monotonic() + JOIN_WAIT_S
    while True:
        m = _manifest_or_none(path)
        if m is not None or time.monotonic() > deadline:
            return m
        if not os.path.isdir(os.path.join(path, model.CONTROL_DIR)):
            return None
        time.sleep(0.05)


def _not_joinable(manifest: dict[str, Any] | None) -> str | None:
    """Why a launcher with ``--join`` may not join the run of ``manifest`` (None: it may)."""
    if manifest is None:
        return (
            f"it is not a holoprof run (no readable {model.MANIFEST} after {JOIN_WAIT_S:.0f} s); "
            "choose a new directory"
        )
    if not manifest.get("join"):
        return "it is a run started without --join; choose a new directory (and pass --join on every node)"
    theirs, ours = manifest.get("job_id"), hosts.job_id()
    if theirs and ours and theirs != ours:
        return f"it belongs to another job ({theirs}, this is {ours}); choose a new directory"
    state, _ = hosts.run_state(manifest)
    if state != "running":
        return f"it has ended ({state}: every host's launcher has stopped); choose a new directory"
    return None


def make_run_dir(out: str | None, name: str) -> str:
    """:func:`create_run_dir` of ``out``, or of a fresh folder under ./holoprof-runs named after the
    time and ``name`` (the next free name when another launcher takes one at the same moment)."""
    return claim_run(out, name).path


def claim_run(out: str | None, name: str, join: bool = False, multi_node: str | None = None) -> Claim:
    """:func:`claim_run_dir` of ``out`` (joined when ``join`` and another launcher created it), or of
    a fresh folder under ./holoprof-runs named after the time and ``name``."""
    if out:
        return claim_run_dir(out, join, multi_node)
    for _ in range(100):
        try:
            return claim_run_dir(default_run_dir(name))
        except RunExistsError:
            continue
    return claim_run_dir(default_run_dir(name))


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
        "host": socket.gethostname(),  # the host of the launcher that created the run
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
    if data.get("join"):  # several launchers: each wrote its own part
        return hosts.merge(data, hosts.read_parts(run_dir))
    return data

"""The control mailbox's format: request and state files of on-demand actions while a job runs.

The training process opens no network port. ``holoprof ctl`` and ``holoprof serve`` write a request
file into ``<run>/control/``; every traced process looks there about once a second (the agent side:
:mod:`holoprof.collect.control`), claims the requests addressed to it at most once, runs them and
writes the result into ``<run>/artifacts/``.

Files (all written atomically: temporary name, then rename):

* ``control/req-<id>.json`` — the request: ``{"id", "action", "target", "params", "created_ns"}``;
  ``target`` is ``null`` (every process of the job) or one of ``{"pid": P}``, ``{"rank": R}``,
  ``{"role": NAME}``.
* ``control/<id>/<host>-<pid>.state`` — one per process that took the request:
  ``{"state": queued|running|done|failed|refused, "reason", "artifacts": [names], ...}``;
  ``refused``: the request was not valid and did not run (``reason`` says why).
* ``artifacts/<action>-<id>-<host>-<pid>.*`` — what the action produced.

Requests are validated on both sides: known actions only (:data:`ACTION_SPECS`), integer parameters
within bounds. The mailbox is read and written only through real directories of the run
(``control/`` and ``control/<id>/`` are opened with ``O_NOFOLLOW``, a symbolic link there is refused)
and a request is read only from a regular file opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never
blocks the reader), at most :data:`MAX_REQUEST_BYTES` and nested at most :data:`MAX_REQUEST_DEPTH`
deep. A bad request file is refused with a reason; it never turns the mailbox off.

This module is read by the agent inside the job too: standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import threading
import time
from typing import Any

from holoprof import model
from holoprof.store.safeio import file_kind

#: The allow-list: action -> {parameter: (minimum, maximum, default)}.
ACTION_SPECS: dict[str, dict[str, tuple[int, int, int]]] = {
    "stacks": {},
    "deep-profile": {"steps": (1, 100, 5)},
    "memory-snapshot": {"max_entries": (1, 1_000_000, 100_000)},
    "io-trace": {"seconds": (1, 600, 10)},
}
TARGET_KEYS = ("pid", "rank", "role")
STATES = ("queued", "running", "done", "failed", "refused")
FINAL_STATES = ("done", "failed", "refused")
#: The reason of a request whose action has no handler in the process that took it.
NOT_AVAILABLE = "not available yet in this version"
MAX_REQUEST_BYTES = 16 * 1024
#: Arrays and objects nested deeper than this are refused before the JSON parser sees them.
MAX_REQUEST_DEPTH = 8
#: State files are a little larger than requests (they carry artifact names and info).
MAX_STATE_BYTES = 4 * MAX_REQUEST_BYTES
#: A request older than this is ignored by processes (they never saw it in time).
MAX_REQUEST_AGE_S = 3600.0

#: A request id (also the name of its state folder).
REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ROLE = re.compile(r"^[a-z_]{1,32}$")
_REQUEST_PREFIX = "req-"
_REQUEST_SUFFIX = ".json"


class RequestError(ValueError):
    """A request that is not valid: the message names the problem and the fix."""


def _validate_params(action: str, params: Any) -> dict[str, int]:
    spec = ACTION_SPECS[action]
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RequestError('params must be a JSON object, e.g. {"steps": 5}')
    out: dict[str, int] = {}
    for key, value in params.items():
        if key not in spec:
            allowed = ", ".join(spec) or "none"
            raise RequestError(f"{action} takes no parameter {key!r} (its parameters: {allowed})")
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(f"{key} must be a whole number, got {value!r}")
        lo, hi, _ = spec[key]
        if not lo <= value <= hi:
            raise RequestError(f"{key} must be between {lo} and {hi}, got {value}")
        out[key] = value
    for key, (_, _, default) in spec.items():
        out.setdefault(key, default)
    return out


def _validate_target(target: Any) -> dict[str, Any]:
    if not isinstance(target, dict) or len(target) != 1 or next(iter(target)) not in TARGET_KEYS:
        raise RequestError('target must be null or one of {"pid": P}, {"rank": R}, {"role": NAME}')
    ((key, value),) = target.items()
    if key == "role":
        if not isinstance(value, str) or not _ROLE.match(value):
            raise RequestError(f"role must be a role name such as 'main' or 'rank', got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**31:
        raise RequestError(f"{key} must be a non-negative whole number, got {value!r}")
    return {key: value}


def validate(
    action: Any, params: Any, target: Any = None
) -> tuple[str, dict[str, int], dict[str, Any] | None]:
    """Check an action, its parameters and its target; return them normalized (defaults filled in)."""
    if not isinstance(action, str) or action not in ACTION_SPECS:
        raise RequestError(f"unknown action {action!r}; the actions are: {', '.join(ACTION_SPECS)}")
    out = _validate_params(action, params)
    if target is not None:
        target = _validate_target(target)
    return action, out, target


def new_request_id() -> str:
    import secrets  # lazy: only where a request is written (ctl, serve), not in every traced process

    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


# --- file names ------------------------------------------------------------------------------------
def request_name(req_id: str) -> str:
    """The file name of a request in ``control/``."""
    return f"{_REQUEST_PREFIX}{req_id}{_REQUEST_SUFFIX}"


def request_id_of(name: str) -> str | None:
    """The id in a request's file name (not checked against :data:`REQUEST_ID`); None for another file."""
    if not (name.startswith(_REQUEST_PREFIX) and name.endswith(_REQUEST_SUFFIX)):
        return None
    return name[len(_REQUEST_PREFIX) : -len(_REQUEST_SUFFIX)]


def state_name(host: str, pid: int) -> str:
    """The file name of one process's state in ``control/<id>/``."""
    return f"{host}-{pid}.state"


# --- descriptors -----------------------------------------------------------------------------------
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_dir(name: str, dir_fd: int | None = None) -> int:
    """Open a directory that must be a real one (not a symbolic link); returns its descriptor.
    Raises OSError (ELOOP or ENOTDIR for a link or a file)."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def close_fd(fd: int) -> None:
    """Close a descriptor, ignoring errors."""
    try:
        os.close(fd)
    except OSError:
        pass


def control_fd(run_dir: str) -> int | None:
    """The run's ``control/`` folder, opened; None when it is missing or not a real directory."""
    try:
        return open_dir(os.path.join(run_dir, model.CONTROL_DIR))
    except OSError:
        return None


def artifact_path(run_dir: str, action: str, req_id: str, host: str, pid: int, suffix: str) -> str:
    """``<run>/artifacts/<action>-<id>-<host>-<pid><suffix>`` (the folder is created)."""
    folder = os.path.join(run_dir, model.ARTIFACTS_DIR)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    close_fd(open_dir(folder))  # a real directory of the run, not a link out of it
    return os.path.join(folder, f"{action}-{req_id}-{host}-{pid}{suffix}")


# --- reading ---------------------------------------------------------------------------------------
def _nesting_ok(data: bytes, limit: int) -> bool:
    """Whether the arrays and objects of a JSON text nest at most ``limit`` deep (strings skipped)."""
    depth = 0
    in_str = esc = False
    for b in data:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:  # backslash
                esc = True
            elif b == 0x22:  # quote
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return False
        elif b in (0x5D, 0x7D):
            depth -= 1
    return True


def parse_request(data: bytes, limit: int = MAX_REQUEST_BYTES) -> dict[str, Any]:
    """The JSON object in ``data``; raises :class:`RequestError` naming what is wrong with it."""
    if len(data) > limit:
        raise RequestError(f"the request is larger than {limit} bytes")
    if not _nesting_ok(data, MAX_REQUEST_DEPTH):
        raise RequestError(f"the request nests deeper than {MAX_REQUEST_DEPTH} levels")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise RequestError(f"the request is not valid JSON ({exc})")
    if not isinstance(doc, dict):
        raise RequestError(f"the request must be a JSON object, not {type(doc).__name__}")
    return doc


def read_file(name: str, dir_fd: int, limit: int = MAX_REQUEST_BYTES) -> tuple[dict[str, Any], int]:
    """Read the JSON object of ``name`` in the directory ``dir_fd``: a regular file only, opened
    without following a symbolic link and without blocking. Returns it and the file's mtime (ns);
    raises :class:`RequestError` with the reason it was refused."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RequestError("the request is a symbolic link; only regular files are read")
        raise RequestError(f"the request cannot be opened ({exc.strerror or exc})")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RequestError(f"the request is {file_kind(st.st_mode)}; only regular files are read")
        if st.st_size > limit:
            raise RequestError(f"the request is larger than {limit} bytes")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise RequestError(f"the request cannot be read ({exc.strerror or exc})")
    finally:
        close_fd(fd)
    return parse_request(b"".join(chunks), limit), st.st_mtime_ns


def _read_json(name: str, dir_fd: int, limit: int = MAX_STATE_BYTES) -> dict[str, Any] | None:
    try:
        return read_file(name, dir_fd, limit)[0]
    except RequestError:
        return None


# --- writing ---------------------------------------------------------------------------------------
def write_json(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically (a temporary name, then rename)."""
    tmp = f"{path}.tmp{os.getpid()}-{threading.get_native_id()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def write_json_at(dir_fd: int, name: str, doc: dict[str, Any]) -> None:
    """Write ``name`` atomically inside the directory ``dir_fd`` (a new file, never through a link)."""
    data = (json.dumps(doc, sort_keys=True) + "\n").encode()
    tmp = f".{name}.tmp{os.getpid()}-{threading.get_native_id()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink(tmp, dir_fd)
        raise


def _unlink(name: str, dir_fd: int | None = None) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def write_request(
    run_dir: str, action: str, params: dict[str, Any] | None = None, target: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Validate and write a request into ``run_dir``'s mailbox; return it (with its id)."""
    action, norm, tgt = validate(action, params, target)
    control = os.path.join(run_dir, model.CONTROL_DIR)
    os.makedirs(control, mode=0o700, exist_ok=True)
    cfd = open_dir(control)
    req_id = new_request_id()
    req = {
        "id": req_id,
        "action": action,
        "target": tgt,
        "params": norm,
        "created_ns": time.time_ns(),
    }
    try:
        write_json_at(cfd, request_name(req_id), req)
    finally:
        close_fd(cfd)
    return req


def write_state(run_dir: str, req_id: str, host: str, pid: int, doc: dict[str, Any]) -> None:
    """Write one process's state of a request into ``control/<id>/``, a real directory of the run
    (created here; a symbolic link in its place is refused, so nothing is written elsewhere).
    Raises OSError when it cannot be written."""
    control = os.path.join(run_dir, model.CONTROL_DIR)
    os.makedirs(control, mode=0o700, exist_ok=True)
    cfd = open_dir(control)
    try:
        try:
            os.mkdir(req_id, 0o700, dir_fd=cfd)
        except FileExistsError:
            pass
        dfd = open_dir(req_id, cfd)
        try:
            write_json_at(dfd, state_name(host, pid), doc)
        finally:
            close_fd(dfd)
    finally:
        close_fd(cfd)


# --- the requests of a run -------------------------------------------------------------------------
def read_request(run_dir: str, req_id: str) -> dict[str, Any] | None:
    if not REQUEST_ID.match(req_id):
        return None
    cfd = control_fd(run_dir)
    if cfd is None:
        return None
    try:
        return _read_json(request_name(req_id), cfd, MAX_REQUEST_BYTES)
    finally:
        close_fd(cfd)


def _states_at(cfd: int, req_id: str) -> list[dict[str, Any]]:
    try:
        dfd = open_dir(req_id, cfd)
    except OSError:
        return []
    try:
        names = sorted(os.listdir(dfd))
        out = []
        for name in names:
            if name.endswith(".state") and not name.startswith("."):
                doc = _read_json(name, dfd)
                if doc is not None:
                    out.append(doc)
        return out
    except OSError:
        return []
    finally:
        close_fd(dfd)


def request_states(run_dir: str, req_id: str) -> list[dict[str, Any]]:
    """The state files of one request: one per process that took it."""
    if not REQUEST_ID.match(req_id):
        return []
    cfd = control_fd(run_dir)
    if cfd is None:
        return []
    try:
        return _states_at(cfd, req_id)
    finally:
        close_fd(cfd)


def list_requests(run_dir: str) -> list[dict[str, Any]]:
    """Every valid request of the run, newest first, each with ``states`` (one per process that
    took it). Request files that are not valid are left out (each process refuses them)."""
    cfd = control_fd(run_dir)
    if cfd is None:
        return []
    out = []
    try:
        names = os.listdir(cfd)
        for name in names:
            if request_id_of(name) is None:
                continue
            req = _read_json(name, cfd, MAX_REQUEST_BYTES)
            if req is None or not isinstance(req.get("id"), str) or not REQUEST_ID.match(req["id"]):
                continue
            out.append({**req, "states": _states_at(cfd, req["id"])})
    except OSError:
        return []
    finally:
        close_fd(cfd)
    out.sort(key=lambda r: r["created_ns"] if isinstance(r.get("created_ns"), int) else 0, reverse=True)
    return out

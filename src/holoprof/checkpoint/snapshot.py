"""Host-memory snapshots of checkpoint objects, in reusable buffers under a memory budget.

``Snapshotter.take(obj)`` returns a ``Snapshot`` that no later change to ``obj`` can alter: the
object's structure and every non-tensor part are pickled into bytes, and the bytes of every tensor
storage are copied into a buffer of a pool (pinned host memory for CUDA tensors, copied with
asynchronous device-to-host copies that are synchronized before ``take`` returns). Storages shared by
several tensors (tied weights, views) are copied once and stay shared in the snapshot, as
``torch.save`` keeps them. ``Snapshot.materialize()`` rebuilds the object on the snapshot's memory
for the serializer; ``release()`` gives the buffers back for the next snapshot.

Snapshots alive (their buffers and pickled bytes) never take more than ``budget_bytes``; ``take``
waits for earlier snapshots to be released rather than exceed it. Buffers are kept by size and reused, so saving the same state again
allocates nothing.
"""

from __future__ import annotations

import ctypes
import io
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

_PoolKey = tuple[int, bool]  # (bytes, pinned)
_COPY_CHUNK = 8 << 20  # host copies are split into pieces of this size, spread over a few threads


class OverBudget(Exception):
    """The snapshot alone needs more memory than the whole budget."""

    def __init__(self, needed: int, budget: int) -> None:
        super().__init__(f"{needed} bytes needed, budget {budget} bytes")
        self.needed = needed
        self.budget = budget


class Aborted(Exception):
    """Waiting for snapshot memory was given up (the buffer is closing or failed)."""


@dataclass
class _TensorRef:
    storage_index: int
    dtype: Any
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool
    parameter: bool


@dataclass
class Snapshot:
    """A consistent copy of one checkpoint object in host memory."""

    payload: bytes | None  # the pickled object, tensors replaced by references; None: ``obj`` as is
    obj: Any
    storages: list[Any]  # uint8 tensors holding the bytes of each storage
    refs: list[_TensorRef]
    nbytes: int  # bytes copied (tensor storages plus the pickled rest)
    copied: bool
    device_bytes: int  # bytes that came from an accelerator
    _release: Callable[[], None] | None = field(default=None, repr=False)

    def materialize(self) -> Any:
        """The checkpoint object, rebuilt on the snapshot's memory (tensors share its buffers)."""
        if self.payload is None:
            return self.obj
        return _Unpickler(io.BytesIO(self.payload), self).load()

    def release(self) -> None:
        """Give the buffers back to the pool (idempotent). Objects from ``materialize`` must be dropped."""
        release, self._release = self._release, None
        if release is not None:
            release()


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: io.BytesIO, snapshot: Snapshot) -> None:
        super().__init__(f)
        self._snapshot = snapshot
        self._built: dict[int, Any] = {}

    def persistent_load(self, pid: Any) -> Any:
        index = int(pid)
        if index in self._built:
            return self._built[index]
        torch = sys.modules["torch"]
        ref = self._snapshot.refs[index]
        storage = self._snapshot.storages[ref.storage_index].untyped_storage()
        t = torch.empty(0, dtype=ref.dtype).set_(storage, ref.offset, ref.size, ref.stride)
        if ref.parameter:
            t = torch.nn.Parameter(t, requires_grad=ref.requires_grad)
        elif ref.requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        self._built[index] = t
        return t


class _Pickler(pickle.Pickler):
    """Pickles the object's structure; tensors become references to storages copied separately."""

    def __init__(self, f: io.BytesIO, torch: Any) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._torch = torch
        self.sources: list[Any] = []  # one per distinct storage: the tensor whose storage it is
        self._storage_index: dict[tuple[str, int, int], int] = {}
        self.refs: list[_TensorRef] = []
        self._ref_index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        torch = self._torch
        if torch is None or not isinstance(obj, torch.Tensor) or not _plain_tensor(torch, obj):
            return None
        known = self._ref_index.get(id(obj))
        if known is not None:
            return known
        storage = obj.untyped_storage()
        key = (str(obj.device), int(storage.data_ptr()), int(storage.nbytes()))
        index = self._storage_index.get(key)
        if index is None:
            index = len(self.sources)
            self._storage_index[key] = index
            self.sources.append(obj)
        self.refs.append(
            _TensorRef(
                storage_index=index,
                dtype=obj.dtype,
                offset=int(obj.storage_offset()),
                size=tuple(obj.size()),
                stride=tuple(obj.stride()),
                requires_grad=bool(obj.requires_grad),
                parameter=isinstance(obj, torch.nn.Parameter),
            )
        )
        self._ref_index[id(obj)] = len(self.refs) - 1
        return len(self.refs) - 1


def _plain_tensor(torch: Any, t: Any) -> bool:
    """Dense tensors of plain type on the CPU or a CUDA device (others pickle the usual way)."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
        and t.device.type in ("cpu", "cuda")
    )


def _has_device_tensor(torch: Any, obj: Any) -> bool:
    """True if a (bounded) walk of the containers in ``obj`` finds a tensor off the CPU."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    seen = 0
    while stack and seen < 200_000:
        x, depth = stack.pop()
        seen += 1
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                return True
        elif isinstance(x, dict) and depth < 16:
            stack.extend((v, depth + 1) for v in x.values())
        elif isinstance(x, (list, tuple)) and depth < 16:
            stack.extend((v, depth + 1) for v in x)
    return False


class Snapshotter:
    """Takes snapshots into a pool of reusable host buffers of at most ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._cond = threading.Condition()
        self._free: dict[_PoolKey, list[Any]] = {}
        self._allocated = 0  # bytes of all buffers of the pool, free or in use
        self._in_use = 0  # bytes of buffers held by snapshots not yet released
        self._aborted = False
        self.allocations = 0  # buffers allocated so far (the rest were reused)
        self._copy_threads = max(1, min(4, os.cpu_count() or 1))
        self._pool: ThreadPoolExecutor | None = None

    @property
    def allocated_bytes(self) -> int:
        with self._cond:
            return self._allocated

    @property
    def in_use_bytes(self) -> int:
        with self._cond:
            return self._in_use

    def abort(self) -> None:
        """Make every waiting and later ``take`` raise ``Aborted``; drop the free buffers."""
        with self._cond:
            self._aborted = True
            for key, bufs in self._free.items():
                self._allocated -= key[0] * len(bufs)
            self._free.clear()
            self._cond.notify_all()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def take(
        self, obj: Any, *, copy: bool = True, should_stop: Callable[[], bool] | None = None
    ) -> tuple[Snapshot, float]:
        """Snapshot ``obj``; returns it and the seconds spent waiting for budget.

        ``copy=False``: host tensors and the object are used as they are (the caller promises not to
        change them until the checkpoint is persisted); only accelerator tensors are copied.
        Raises ``OverBudget`` when the copies alone need more than the budget, ``pickle`` errors when
        the object cannot be pickled.
        """
        torch = sys.modules.get("torch")
        if not copy and (torch is None or not _has_device_tensor(torch, obj)):
            return Snapshot(None, obj, [], [], 0, False, 0), 0.0
        f = io.BytesIO()
        pickler = _Pickler(f, torch)
        pickler.dump(obj)
        payload = f.getvalue()
        plan: list[tuple[Any, bool]] = []  # (source tensor, copy it)
        needed = 0
        for src in pickler.sources:
            on_device = src.device.type != "cpu"
            do_copy = copy or on_device
            plan.append((src, do_copy))
            if do_copy:
                needed += int(src.untyped_storage().nbytes())
        needed += len(payload)  # counted, not pooled: it bounds how many snapshots are alive
        if needed > self.budget_bytes:
            raise OverBudget(needed, self.budget_bytes)
        waited = self._reserve(needed, should_stop)
        held: list[tuple[_PoolKey, Any]] = []
        try:
            storages, device_bytes = self._copy(torch, plan, held)
        except BaseException:
            self._give_back(held, needed)
            raise
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._give_back(held, needed)

        snap = Snapshot(
            payload=payload,
            obj=None,
            storages=storages,
            refs=pickler.refs,
            nbytes=needed,
            copied=copy,
            device_bytes=device_bytes,
            _release=release,
        )
        return snap, waited

    # internals -------------------------------------------------------------------------------------

    def _reserve(self, needed: int, should_stop: Callable[[], bool] | None) -> float:
        t0 = time.perf_counter()
        with self._cond:
            while self._in_use + needed > self.budget_bytes:
                if self._aborted or (should_stop is not None and should_stop()):
                    raise Aborted()
                self._cond.wait(0.5)
            if self._aborted:
                raise Aborted()
            self._in_use += needed
        return time.perf_counter() - t0

    def _buffer(self, torch: Any, nbytes: int, pinned: bool) -> tuple[_PoolKey, Any]:
        key = (nbytes, pinned)
        with self._cond:
            free = self._free.get(key)
            if free:
                return key, free.pop()
            # make room: drop free buffers of other sizes until the new one fits the budget
            for other in list(self._free):
                while self._free[other] and self._allocated + nbytes > self.budget_bytes:
                    self._free[other].pop()
                    self._allocated -= other[0]
                if not self._free[other]:
                    del self._free[other]
            self._allocated += nbytes
            self.allocations += 1
        try:
            return key, torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        except BaseException:
            with self._cond:
                self._allocated -= nbytes
            raise

    def _host_copy(self, pieces: list[tuple[int, int, int]]) -> None:
        """Copy ``(dst, src, nbytes)`` host memory ranges with ``memmove`` on a few threads.

        ``memmove`` through ctypes releases the GIL, and plain threads cost nothing when cores are
        busy, where torch's own parallel copy waits for all its OpenMP threads and slows down
        several-fold on an oversubscribed machine.
        """
        chunks: list[tuple[int, int, int]] = []
        for dst, src, n in pieces:
            for off in range(0, n, _COPY_CHUNK):
                chunks.append((dst + off, src + off, min(_COPY_CHUNK, n - off)))
        if len(chunks) <= 1 or self._copy_threads <= 1:
            for dst, src, n in chunks:
                ctypes.memmove(dst, src, n)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._copy_threads, thread_name_prefix="holoprof-ckpt-copy")
        for future in [self._pool.submit(ctypes.memmove, d, s, n) for d, s, n in chunks]:
            future.result()

    def _copy(
        self, torch: Any, plan: list[tuple[Any, bool]], held: list[tuple[_PoolKey, Any]]
    ) -> tuple[list[Any], int]:
        storages: list[Any] = []
        device_bytes = 0
        streams: dict[Any, Any] = {}
        host: list[tuple[int, int, int]] = []
        for src, do_copy in plan:
            source = torch.empty(0, dtype=torch.uint8, device=src.device).set_(src.untyped_storage())
            if not do_copy:
                storages.append(source)
                continue
            on_device = src.device.type == "cuda"
            pinned = on_device and bool(torch.cuda.is_available())
            key, buf = self._buffer(torch, int(source.numel()), pinned)
            held.append((key, buf))
            if on_device:
                # asynchronous device-to-host copy into pinned memory, ordered after the work that
                # produced the tensor on the current stream; synchronized below, before returning
                buf.copy_(source, non_blocking=pinned)
                streams[src.device] = torch.cuda.current_stream(src.device)
                device_bytes += int(source.numel())
            elif source.numel():
                host.append((int(buf.data_ptr()), int(source.data_ptr()), int(source.numel())))
            storages.append(buf)
        self._host_copy(host)  # while the device copies run
        for stream in streams.values():
            stream.synchronize()
        return storages, device_bytes

    def _give_back(self, held: list[tuple[_PoolKey, Any]], needed: int) -> None:
        with self._cond:
            for key, buf in held:
                if self._aborted:
                    self._allocated -= key[0]
                else:
                    self._free.setdefault(key, []).append(buf)
            held.clear()
            self._in_use -= needed
            self._cond.notify_all()

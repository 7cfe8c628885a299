"""Bytes per category (weights, gradients, optimizer state, activations) of what the hooks found.

**weights** are the parameters (and buffers) of the modules that ran a training forward, plus the
parameters the optimizers hold; **gradients** their ``.grad``; **optimizer_state** every tensor in
``optimizer.state``; **activations** the tensors saved for backward that the autograd graph still holds.
Storages shared between tensors are counted once (keyed by storage address and size), in the first
category that claims them (weights, gradients, optimizer state, activations, in that order). What does
not change from step to step is counted once and cached.

A tensor subclass that wraps other tensors (a DTensor: FSDP2's sharded parameters, their gradients
and Adam's state of them) is counted by what it wraps (its local shard: the memory this process
holds). FSDP2's unsharded parameters count while they exist: their storage is freed (to 0 bytes)
after the forward. A tensor whose storage cannot be read is not counted, and the snapshots say so
(``tensors_unmeasured``: how many, of which types).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from holoprof.collect.memory_hooks import ForwardTracker
from holoprof.collect.memory_schedule import EVERY
from holoprof.collect.memory_storage import StorageKey, storage_bytes, tensor_ptr

CATEGORIES: tuple[str, ...] = ("weights", "gradients", "optimizer_state", "activations", "other")
PER_LAYER_TOP = 50

#: (storage keys, bytes, count, bytes on a GPU) of one category
Claimed = tuple[set[StorageKey], int, int, int]


class TensorAccounts:
    """The optimizers seen, and the tensors of each category, counted with caches between snapshots."""

    def __init__(self, tracker: ForwardTracker) -> None:
        self.tracker = tracker
        self.reset()

    def reset(self) -> None:
        self._optimizers: dict[int, Any] = {}  # id -> weak reference (a dict: seen twice a step, cheaply)
        # weights, for the forward's snapshots and for the others (FSDP2: after the forward the root's
        # parameters are still unsharded, after the backward every parameter is sharded again):
        # (key, (params, storage keys, bytes, GPU bytes), data_ptr of each param)
        self._wcache: dict[
            bool, tuple[tuple[int, int, int], tuple[list[Any], set[StorageKey], int, int], list[int]]
        ] = {}
        # gradients: ((id, data_ptr) of each .grad, result, storage key by (id, data_ptr))
        self._gcache: tuple[list[tuple[int, int]], Claimed, dict[Any, Any]] | None = None
        self._ostats: tuple[Any, Any, Claimed] | None = None
        # the measured step whose parameters were checked against each cache
        self._wchecked: dict[bool, int] = {}
        self._layer_params: dict[str, int] = {}
        # optimizer state: (epoch, ids of the state's values, [(storage key, bytes, on GPU)])
        self._ocache: tuple[int, list[int], list[tuple[StorageKey, int, bool]]] | None = None

    # -- optimizers (seen by the optimizer hooks) --------------------------------------------------
    def see_optimizer(self, optimizer: Any) -> None:
        i = id(optimizer)
        r = self._optimizers.get(i)
        if r is not None and r() is optimizer:
            return
        opts = self._optimizers

        def gone(ref: Any, i: int = i) -> None:
            if opts.get(i) is ref:
                del opts[i]

        opts[i] = weakref.ref(optimizer, gone)

    def live_optimizers(self) -> list[Any]:
        return [o for o in (r() for r in list(self._optimizers.values())) if o is not None]

    def params(self) -> Iterable[Any]:
        """The parameters of the modules seen and of the optimizers, each once."""
        seen: set[int] = set()
        for m in list(self.tracker.modules):
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p
        for opt in self.live_optimizers():
            for group in opt.param_groups:
                for p in group.get("params", ()):
                    if id(p) not in seen:
                        seen.add(id(p))
                        yield p

    # -- counting ----------------------------------------------------------------------------------
    def categories(self, include_per_layer: bool = False, phase: str = "optimizer") -> dict[str, Any]:
        """Bytes per category now (storages counted once, in the first category that claims them:
        weights, gradients, optimizer state, activations), and per layer when asked."""
        params, wkeys, wbytes, cuda = self._weights(phase == "forward")
        gkeys, gbytes, gcount, gcuda = self._gradients(params, wkeys)
        cuda += gcuda
        entries = self._optimizer_state(phase)
        c = self._ostats
        if c is None or c[0] is not entries or c[1] is not wkeys:  # counted once per new state or weights
            c = (entries, wkeys, claim(entries, (wkeys,)))
            self._ostats = c
        okeys, obytes, ocount, ocuda = c[2]
        if not gkeys.isdisjoint(okeys):  # a gradient claims a storage the state also holds (rare)
            okeys, obytes, ocount, ocuda = claim(entries, (wkeys, gkeys))
        cuda += ocuda
        abytes, acount, acuda, per_layer = self._activations((wkeys, gkeys, okeys), include_per_layer)
        cuda += acuda
        cats = {
            "weights": wbytes,
            "gradients": gbytes,
            "optimizer_state": obytes,
            "activations": abytes,
            "other": 0,
        }
        counts = {
            "weights": len(wkeys),
            "gradients": gcount,
            "optimizer_state": ocount,
            "activations": acount,
            "other": 0,
        }
        out: dict[str, Any] = {"categories": cats, "tensors": counts, "cuda_tensor_bytes": cuda}
        if include_per_layer:
            out["per_layer"] = self._per_layer(per_layer)
        return out

    def _activations(
        self, taken: tuple[set[StorageKey], set[StorageKey], set[StorageKey]], include_per_layer: bool
    ) -> tuple[int, int, int, dict[str, int]]:
        """(bytes, count, bytes on a GPU, bytes by layer) of the live saved tensors no other category holds."""
        wkeys, gkeys, okeys = taken
        abytes = acount = cuda = 0
        per_layer: dict[str, int] = {}
        akeys: set[StorageKey] = set()
        for _r, k, on_gpu, layer in self.tracker.live_saved():
            if k in wkeys or k in gkeys or k in okeys or k in akeys:
                continue
            akeys.add(k)
            n = k[1]
            abytes += n
            acount += 1
            if on_gpu:
                cuda += n
            if include_per_layer:
                per_layer[layer] = per_layer.get(layer, 0) + n
        return abytes, acount, cuda, per_layer

    def _optimizer_state(self, phase: str) -> list[tuple[StorageKey, int, bool]]:
        """[(storage key, bytes, on a GPU)] of the optimizers' state, each storage once.

        The state changes only inside ``optimizer.step()``, and its sizes only when a tensor in it is
        replaced (Adam updates ``exp_avg`` in place): after each step the identities of the state's
        values are compared with the last count's, and the tensors are counted again only when one
        differs (and on every EVERY-th step). The forward and backward snapshots of the next step reuse
        the count.
        """
        c = self._ocache
        if phase != "optimizer" and c is not None:
            return c[2]
        opts = self.live_optimizers()
        ids = [
            id(v) for opt in opts for st in opt.state.values() if isinstance(st, dict) for v in st.values()
        ]
        epoch = self.tracker.measure_step // EVERY
        if c is not None and c[0] == epoch and c[1] == ids:
            return c[2]
        keys: set[StorageKey] = set()
        entries: list[tuple[StorageKey, int, bool]] = []
        for opt in opts:
            for state in list(opt.state.values()):
                for v in tensors_in(state.values() if isinstance(state, dict) else ()):
                    for k, on_gpu in self.tracker.keys_or_note(v):
                        if k in keys:
                            continue
                        keys.add(k)
                        entries.append((k, k[1], on_gpu))
        if phase == "optimizer":
            self._ocache = (epoch, ids, entries)
        return entries

    def _gradients(self, params: list[Any], wkeys: set[StorageKey]) -> Claimed:
        """(storage keys, bytes, count, bytes on a GPU) of the parameters' ``.grad`` not already weights.

        A gradient tensor is looked at once: its storage key is kept by (id, data pointer), which holds
        no reference to it, and the whole result is reused while every parameter has the same gradient
        tensor (the backward and optimizer snapshots of a step, usually).
        """
        ident = [(id(g), tensor_ptr(g)) for p in params if (g := p.grad) is not None]
        c = self._gcache
        if c is not None and c[0] == ident:
            return c[1]
        known = c[2] if c is not None else {}
        keys: set[StorageKey] = set()
        total = count = cuda = 0
        memo: dict[tuple[int, int], list[tuple[StorageKey, bool]]] = {}
        for p in params:
            g = p.grad
            if g is None:
                continue
            i = (id(g), tensor_ptr(g))
            hit = known.get(i)
            if hit is None:
                hit = self.tracker.keys_or_note(g)
            memo[i] = hit
            for k, on_gpu in hit:
                if k in wkeys or k in keys:
                    continue
                keys.add(k)
                total += k[1]
                count += 1
                if on_gpu:
                    cuda += k[1]
        value = (keys, total, count, cuda)
        self._gcache = (ident, value, memo)
        return value

    def _weights(self, forward: bool) -> tuple[list[Any], set[StorageKey], int, int]:
        """Parameters and buffers: (params, storage keys, bytes, bytes on a GPU), cached, one cache
        for the snapshots after the forward and one for the others (the modules may hold other
        parameters then: FSDP2's unsharded ones, until the backward reshards them).

        They do not change from step to step unless a parameter's storage is replaced (moved to another
        device, loaded into a new tensor): the cache is rebuilt when a module or an optimizer shows up,
        when a parameter's data pointer differs from the cached one (checked once a measured step), and
        every EVERY steps (buffers replaced, parameters added to an optimizer).
        """
        tracker = self.tracker
        key = (tracker.measure_step // EVERY, len(tracker.modules), len(self._optimizers))
        c = self._wcache.get(forward)
        if c is not None and c[0] == key:
            if self._wchecked.get(forward) == tracker.measure_step:
                return c[1]
            self._wchecked[forward] = tracker.measure_step
            if [tensor_ptr(p) for p in c[1][0]] == c[2]:
                return c[1]
            tracker.roots.clear()  # the device of the model may have changed too
        params = list(self.params())
        keys: set[StorageKey] = set()
        total = cuda = 0
        tensors = [*params, *(b for m in list(tracker.modules) for b in m.buffers())]
        for t in tensors:
            for k, on_gpu in self.tracker.keys_or_note(t):
                if k in keys:
                    continue
                keys.add(k)
                total += k[1]
                if on_gpu:
                    cuda += k[1]
        layer_params = _layer_params(tracker.modules)
        value = (params, keys, total, cuda)
        self._wcache[forward] = (key, value, [tensor_ptr(p) for p in params])
        self._wchecked[forward] = tracker.measure_step
        self._layer_params = layer_params
        return value

    def _per_layer(self, activations: dict[str, int]) -> list[dict[str, Any]]:
        params = self._layer_params
        rows: list[dict[str, Any]] = [
            {"name": k, "activation_bytes": activations.get(k, 0), "parameter_bytes": params.get(k, 0)}
            for k in set(activations) | set(params)
        ]
        rows.sort(key=lambda r: (-(r["activation_bytes"] + r["parameter_bytes"]), r["name"]))
        return rows[:PER_LAYER_TOP]


def _layer_params(modules: Iterable[Any]) -> dict[str, int]:
    """Bytes of the parameters each submodule holds itself, by "name (type)"."""
    layer_params: dict[str, int] = {}
    for m in list(modules):
        for name, sub in m.named_modules():
            label = f"{name} ({type(sub).__name__})" if name else type(sub).__name__
            b = sum(storage_bytes(p) for p in sub.parameters(recurse=False))
            if b:
                layer_params[label] = layer_params.get(label, 0) + b
    return layer_params


def claim(entries: list[tuple[StorageKey, int, bool]], taken: tuple[set[StorageKey], ...]) -> Claimed:
    """(keys, bytes, count, bytes on a GPU) of the entries whose storage no earlier category holds."""
    keys: set[StorageKey] = set()
    total = count = cuda = 0
    for k, n, on_gpu in entries:
        if k in keys or any(k in t for t in taken):
            continue
        keys.add(k)
        total += n
        count += 1
        if on_gpu:
            cuda += n
    return keys, total, count, cuda


def tensors_in(values: Iterable[Any]) -> Iterable[Any]:
    """The tensors among ``values``, and in the lists and tuples among them (one level)."""
    for v in values:
        if hasattr(v, "untyped_storage"):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if hasattr(x, "untyped_storage"))

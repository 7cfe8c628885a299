"""Knobs applied inside the job with no code change: ``holoprof run --set NAME=VALUE``.

The values travel in the agent options (``options["knobs"]``, also kept in the run's manifest) and
are applied by this collector in the job's own process:

========================  ========================================================================
``num_workers``           every ``torch.utils.data.DataLoader`` built by the job (keyword
``prefetch_factor``       arguments replaced at construction; ``prefetch_factor`` and
``pin_memory``            ``persistent_workers`` only where the loader ends up with workers, since
``persistent_workers``    PyTorch refuses them without)
``batch_size``            DataLoaders built from a dataset with a ``batch_size`` (not with a
                          ``batch_sampler``, whose batches are the job's own)
``torch_threads``         ``torch.set_num_threads`` in the main process right after ``import torch``;
                          the job's own later calls there are held to the knob (DataLoader workers
                          keep their one thread)
``num_parallel_calls``    tf.data: ``Dataset.map(..., num_parallel_calls=...)`` of the job's pipeline
``prefetch``              tf.data: the buffer of the job's ``Dataset.prefetch(...)`` calls
                          (``autotune`` for ``tf.data.AUTOTUNE``)
``matmul_precision``      ``torch.set_float32_matmul_precision`` (``highest``, ``high``: TF32 on
                          GPUs with Tensor Cores, ``medium``) right after ``import torch`` in every
                          process of the job that imports it; the job's own later calls are held
                          to the knob
``autocast``              ``bf16``: the outermost module call of each thread (the model's forward,
                          and its evaluation) runs under ``torch.autocast(device, torch.bfloat16)``,
                          the device that of the call's first tensor argument (or the module's
                          first parameter); not where the job already autocasts, nor inside a
                          backward pass (activation checkpointing's recomputation keeps the
                          forward's own state); ``off``: the job as it is
``omp_wait_policy``       ``OMP_WAIT_POLICY`` (``passive``: idle OpenMP threads sleep at once;
                          ``active``: they spin; ``default``: the job's environment as it is, whose
                          runtime default spins a while, then sleeps) in the job's environment when
                          the agent starts, before the job imports torch, so that torch's OpenMP
                          runtime and every process the job starts read it; not applied when OpenMP
                          was loaded first
========================  ========================================================================

What was applied is recorded in the process's row (``processes.info["knobs"]``: the values asked for
and, per knob, how many times it was applied or why not), so a run says which configuration it
measured; each DataLoader's ``dataloader`` op span records the values it really has.
"""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, Collector
from holoprof.agent.setup import post_import_finder
from holoprof.knobspec import KNOBS, LOADER_KNOBS, TF_KNOBS


# --- in the job --------------------------------------------------------------------------------------
class KnobCollector(Collector):
    name = "knobs"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        raw = agent.options.get("knobs") or {}
        self.knobs: dict[str, Any] = {k: v for k, v in raw.items() if k in KNOBS}
        self.pid = os.getpid()
        self.applied: dict[str, Any] = {}

    def install(self) -> None:
        if not self.knobs:
            return
        self.agent.info["knobs"] = {"set": dict(self.knobs), "applied": self.applied}
        policy = str(self.knobs.get("omp_wait_policy", "default"))
        if policy != "default" and os.getpid() == self.pid:
            self._omp_wait_policy(policy.upper())
        elif "omp_wait_policy" in self.knobs:
            self._count("omp_wait_policy", "left as the job's environment has it")
        if any(k in self.knobs for k in (*LOADER_KNOBS, "torch_threads", "matmul_precision", "autocast")):
            post_import_finder().add("torch", self._guard(self._on_torch))
        if any(k in self.knobs for k in TF_KNOBS):
            post_import_finder().add("tensorflow", self._guard(self._on_tensorflow))

    def _omp_wait_policy(self, value: str) -> None:
        # OpenMP runtimes read OMP_WAIT_POLICY once, when they are loaded (with torch, usually)
        try:
            with open("/proc/self/maps") as f:
                loaded = any("libgomp" in line or "libiomp" in line or "libomp" in line for line in f)
        except OSError:
            loaded = "torch" in sys.modules
        if loaded:
            self._count("omp_wait_policy", "not applied: OpenMP was loaded before the agent started")
            return
        before = os.environ.get("OMP_WAIT_POLICY")
        os.environ["OMP_WAIT_POLICY"] = value
        if before and before.upper() != value:
            self._count("omp_wait_policy", f"applied (the job's environment had {before})")
        else:
            self._count("omp_wait_policy")

    def after_fork_child(self) -> None:
        self.applied.clear()  # a DataLoader worker: what its parent applied is in the parent's row

    def _guard(self, fn: Any) -> Any:
        def hook(module: ModuleType) -> None:
            if not self.enabled:
                return
            try:
                fn(module)
            except Exception as exc:
                self.agent.fail(self, exc)

        return hook

    def _count(self, knob: str, note: str = "applied") -> None:
        entry = self.applied.setdefault(knob, {})
        entry[note] = entry.get(note, 0) + 1

    # -- PyTorch ---------------------------------------------------------------------------------
    def _on_torch(self, torch: ModuleType) -> None:
        # lazy: the job's framework, imported by the job, never by the agent
        import torch.utils.data.dataloader as dl_mod

        knobs = self.knobs
        col = self
        if "torch_threads" in knobs and os.getpid() == self.pid:
            n = int(knobs["torch_threads"])
            orig_set = torch.set_num_threads
            torch.set_num_threads(n)
            self._count("torch_threads")

            def set_num_threads(k: int) -> None:
                # DataLoader workers (forked, or spawned: their _worker_loop asks) keep their one thread
                worker = sys._getframe(1).f_code.co_name == "_worker_loop" or os.getpid() != col.pid
                if col.enabled and not worker:
                    col._count("torch_threads", f"held at {n} (the job asked for {k})")
                    return orig_set(n)
                return orig_set(k)

            set_num_threads.__wrapped__ = orig_set  # type: ignore[attr-defined]
            self._set(torch, "set_num_threads", set_num_threads)
        if "matmul_precision" in knobs:
            self._matmul_precision(torch, str(knobs["matmul_precision"]))
        if knobs.get("autocast", "off") != "off":
            self._autocast(torch)
        elif "autocast" in knobs:
            self._count("autocast", "off: the job's own forward")
        if not any(k in knobs for k in LOADER_KNOBS):
            return
        cls = dl_mod.DataLoader
        orig_init = cls.__init__

        def __init__(self_: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
            if col.enabled:
                try:
                    kwargs = col._loader_kwargs(orig_init, dataset, args, kwargs)
                    args = ()
                except TypeError:
                    pass  # arguments DataLoader itself refuses: it says so, below, as it would untraced
                except Exception as exc:
                    col.agent.fail(col, exc)
            orig_init(self_, dataset, *args, **kwargs)

        __init__.__wrapped__ = orig_init  # type: ignore[attr-defined]
        self._set(cls, "__init__", __init__)

    def _matmul_precision(self, torch: ModuleType, value: str) -> None:
        """``torch.set_float32_matmul_precision(value)`` now; the job's own later calls are held to it."""
        orig = torch.set_float32_matmul_precision
        orig(value)
        self._count("matmul_precision")
        col = self

        def set_float32_matmul_precision(precision: str) -> None:
            if col.enabled and precision != value:
                col._count("matmul_precision", f"held at {value} (the job asked for {precision})")
                return orig(value)
            return orig(precision)

        set_float32_matmul_precision.__wrapped__ = orig  # type: ignore[attr-defined]
        self._set(torch, "set_float32_matmul_precision", set_float32_matmul_precision)

    def _autocast(self, torch: ModuleType) -> None:
        """The outermost module call of each thread under ``torch.autocast(device, bfloat16)``."""
        orig_call = torch.nn.Module.__call__
        compiler = getattr(torch, "compiler", None)
        is_compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
        graph_task_id = getattr(torch._C, "_current_graph_task_id", None) or (lambda: -1)
        tls = threading.local()
        col = self

        def __call__(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(tls, "inside", False) or not col.enabled or is_compiling() or graph_task_id() != -1:
                return orig_call(self_, *args, **kwargs)
            try:
                device = _device_of(torch, self_, args, kwargs)
                ctx = None
                if device is None:
                    col._count("autocast", "not applied: no tensor or parameter says the device")
                elif torch.is_autocast_enabled(device):
                    col._count("autocast", "left as the job has it: the job autocasts itself")
                else:
                    ctx = torch.autocast(device, dtype=torch.bfloat16)
                    col._count("autocast", f"applied on {device}")
            except Exception as exc:
                col.agent.fail(col, exc)
                ctx = None
            tls.inside = True
            try:
                if ctx is None:
                    return orig_call(self_, *args, **kwargs)
                with ctx:
                    return orig_call(self_, *args, **kwargs)
            finally:
                tls.inside = False

        __call__.__wrapped__ = orig_call  # type: ignore[attr-defined]
        self._set(torch.nn.Module, "__call__", __call__)

    def _loader_kwargs(
        self, orig_init: Any, dataset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        # lazy: loaded only when this runs
        import inspect

        bound = inspect.signature(orig_init).bind(None, dataset, *args, **kwargs)
        kw = dict(bound.arguments)
        kw.pop("self", None)
        kw.pop("dataset", None)
        extra = kw.pop("kwargs", None)  # a **kwargs catch-all, if this DataLoader has one
        if isinstance(extra, dict):
            kw.update(extra)
        knobs = self.knobs
        if "num_workers" in knobs:
            kw["num_workers"] = int(knobs["num_workers"])
            self._count("num_workers")
        if "pin_memory" in knobs:
            kw["pin_memory"] = bool(knobs["pin_memory"])
            self._count("pin_memory")
        workers = int(kw.get("num_workers") or 0)
        for k in ("prefetch_factor", "persistent_workers"):
            if k not in knobs:
                continue
            if workers > 0:
                kw[k] = knobs[k]
                self._count(k)
            else:
                self._count(k, "not applied: the loader has num_workers=0")
        if workers == 0 and kw.get("prefetch_factor") is not None and "num_workers" in knobs:
            kw["prefetch_factor"] = None  # the job's own value is refused by PyTorch without workers
        if workers == 0 and kw.get("persistent_workers") and "num_workers" in knobs:
            kw["persistent_workers"] = False
        if "batch_size" in knobs:
            if kw.get("batch_sampler") is not None or kw.get("batch_size", 1) is None:
                self._count("batch_size", "not applied: the loader has its own batch_sampler")
            else:
                kw["batch_size"] = int(knobs["batch_size"])
                self._count("batch_size")
        return kw

    # -- tf.data ----------------------------------------------------------------------------------
    def _on_tensorflow(self, tf: ModuleType) -> None:
        data: Any = getattr(tf, "data", None)
        ds = getattr(data, "Dataset", None)
        if ds is None:
            return
        knobs = self.knobs
        col = self

        def tf_value(v: Any) -> Any:
            return data.AUTOTUNE if v == "autotune" else int(v)

        if "num_parallel_calls" in knobs:
            orig_map = ds.map

            def map(self_: Any, *args: Any, **kwargs: Any) -> Any:
                if col.enabled:
                    # lazy: loaded only when this runs
                    import inspect

                    bound = inspect.signature(orig_map).bind(self_, *args, **kwargs)
                    bound.arguments["num_parallel_calls"] = tf_value(knobs["num_parallel_calls"])
                    col._count("num_parallel_calls")
                    return orig_map(*bound.args, **bound.kwargs)
                return orig_map(self_, *args, **kwargs)

            map.__wrapped__ = orig_map  # type: ignore[attr-defined]
            self._set(ds, "map", map)
        if "prefetch" in knobs:
            orig_prefetch = ds.prefetch

            def prefetch(self_: Any, buffer_size: Any = None, *args: Any, **kwargs: Any) -> Any:
                if col.enabled:
                    buffer_size = tf_value(knobs["prefetch"])
                    col._count("prefetch")
                return orig_prefetch(self_, buffer_size, *args, **kwargs)

            prefetch.__wrapped__ = orig_prefetch  # type: ignore[attr-defined]
            self._set(ds, "prefetch", prefetch)


def _device_of(torch: ModuleType, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The device type ("cpu", "cuda", ...) of a module call: its first tensor argument's, else its
    first parameter's; None when neither exists."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return str(a.device.type)
    for p in module.parameters():
        return str(p.device.type)
    return None

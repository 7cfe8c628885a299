"""TensorFlow and Keras 3, always on: steps, input wait, eval and checkpoints with no code change.

What is measured, and how honestly:

* ``model.fit``: a callback added to the job's own callbacks gives steps (one per train batch),
  epochs, and the validation passes (``eval``). Keras runs forward, backward and the optimizer update
  as one compiled call, so that time is one phase, ``compute`` (forward + backward + optimizer,
  fused), not an invented split.
* Input wait in ``fit``/``evaluate``: Keras fetches the next batch inside its compiled function,
  where Python cannot time it, so by default the wait for input is part of ``compute`` (the phase's
  ``fused`` attribute then lists ``data_wait``, and the report says so). Tracing never changes what
  the job computes, and any other way of timing the fetch does: ``holoprof run --tf-input-timing on``
  hands Keras a plain Python iterator over the same dataset (Keras's own path for non-``tf.data``
  iterators, used only with ``steps_per_execution=1``), so each fetch is timed as ``data_wait``; but
  that path trains differently. At the end of a dataset of unknown length Keras's in-graph fetch
  advances the optimizer's iteration counter once more (17 iterations for 16 batches an epoch),
  which moves Adam's bias correction and learning-rate schedules; the Python path does not; and the
  step function is traced without the iterator, which shifts the op-level seeds of unseeded
  ``tf.random`` ops. Use it to diagnose an input pipeline, not for a run whose results matter.
* Custom loops: iterating a ``tf.data`` dataset eagerly, or calling ``next()`` on the iterator of a
  ``tf.distribute`` dataset, is ``data_wait``; an iteration that runs out after a training step is an
  epoch (:mod:`holoprof.collect.tf_input`). ``GradientTape.gradient`` is ``backward``;
  ``optimizer.apply_gradients`` is ``optimizer`` and ends a step. A ``tf.function`` whose trace
  computed or applied gradients (``strategy.run(step_fn)`` in it included, whatever updates the
  variables) is a training step function: each call is ``compute`` and a step.
* Keras on the torch backend: the train step is eager torch code. The callback gives steps and
  epochs (the torch collector counts no epoch at the end of Keras's DataLoader meanwhile); the torch
  collector times the forward, the backward and the DataLoader's fetches (``data_wait``); the Keras
  optimizer's ``apply`` is ``optimizer``, with the torch collector's optimizer observers (the memory
  collector) around it; a whole ``evaluate``/``predict`` is ``eval``. Keras's symbolic calls (building
  a model on ``KerasTensor``s, ``fit``'s build from one batch's shapes) are no phase.
* Checkpoints: ``Model.save``/``save_weights``/``load_weights`` (so ``ModelCheckpoint``, ``.keras`` and
  ``.weights.h5``, on every backend) and ``tf.train.Checkpoint.save``/``write``/``restore``/``read``
  are ``checkpoint``, with path and bytes.
* GPU memory from ``tf.config.experimental.get_memory_info`` when TensorFlow sees GPUs.
"""

from __future__ import annotations

import os
import sys
import weakref
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, Collector, now_ns
from holoprof.agent.setup import post_import_finder
from holoprof.collect.tf_input import InputFetches
from holoprof.collect.torch.collector import torch_state
from holoprof.collect.torch.state import OptimizerObserver, TorchState
from holoprof.collect.util import path_bytes as _path_bytes

IN_GRAPH_FETCH_NOTE = (
    "Keras fetched its batches inside the compiled train step, so `compute` includes the wait for input "
    "and data_wait is not measured (holoprof run --tf-input-timing on measures it, but changes how Keras "
    "iterates: use it to diagnose the input pipeline, not for a run whose results matter)"
)


class TensorFlowCollector(Collector):
    name = "tensorflow"
    default_fault = "keras_callback"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._done: set[str] = set()
        self.input_timing = str(agent.options.get("tf_input_timing", "off")) == "on"
        self._mode: list[str] = []  # keras calls in progress: fit / evaluate / predict
        self._fetch_end = 0
        self._fn_stack: list[int] = []
        self._train_fns: set[int] = set()
        self._gpu_names: list[str] | None = None
        self._in_graph_noted = False
        self._input = InputFetches(self, self.in_keras)
        #: Keras runs on the torch backend: its train step is eager torch code, which the torch
        #: collector times (forward, backward) and its DataLoader fetches (data_wait)
        self.keras_torch = False
        self._loop_state: TorchState | None = None  # the torch collector's, while a fit counts epochs
        self._torch_st: TorchState | None = None  # the torch collector's, once Keras's optimizer runs
        self._opt_views: weakref.WeakKeyDictionary[Any, KerasOptimizerView] = weakref.WeakKeyDictionary()

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        finder = post_import_finder()
        finder.add("tensorflow", self._on_tf)
        finder.add("keras", self._on_keras)

    def _guard(self, key: str, fn: Any, module: ModuleType) -> None:
        if key in self._done or not self.enabled:
            return
        self._done.add(key)
        try:
            fn(module)
        except Exception as exc:
            self.agent.fail(self, exc)

    def _on_tf(self, tf: ModuleType) -> None:
        self._guard("tf", self._patch_tf, tf)
        keras = sys.modules.get("keras")
        # `import keras` imports tensorflow half-way through its own start-up: patch keras only once
        # it is complete (otherwise its own post-import hook does it).
        if keras is not None and getattr(keras, "callbacks", None) is not None:
            self._guard("keras", self._patch_keras, keras)

    def _on_keras(self, keras: ModuleType) -> None:
        if "tensorflow" in sys.modules:
            self._guard("tf", self._patch_tf, sys.modules["tensorflow"])
        self._guard("keras", self._patch_keras, keras)

    # -- helpers -----------------------------------------------------------------------------------
    def _phase(self, name: str, t0: int, t1: int, attrs: dict[str, Any] | None = None) -> None:
        self.agent.span("phase", name, t0, t1, self.agent.steps.index, attrs)

    def _mode_now(self) -> str | None:
        return self._mode[-1] if self._mode else None

    def in_keras(self) -> bool:
        """A Keras call (fit, evaluate, predict) is in progress: it iterates its own data."""
        return bool(self._mode)

    def note_in_graph_fetch(self) -> None:
        """Say once, in the report, that this process's ``compute`` includes the wait for input."""
        if self._in_graph_noted:
            return
        self._in_graph_noted = True
        self.agent.info.setdefault("notes", []).append(IN_GRAPH_FETCH_NOTE)

    # -- TensorFlow: custom loops, checkpoints, GPU memory -----------------------------------------
    def _patch_tf(self, tf: ModuleType) -> None:
        # tensorflow's own modules: tensorflow is loaded by the job (this runs after it imports it)
        # lazy: the job's framework, imported by the job, never by the agent
        from tensorflow.python.data.ops import iterator_ops
        from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf

        inside_function = tf.inside_function
        self._input.wrap(iterator_ops.OwnedIterator, "__next__", inside_function, (StopIteration,))
        distributed = _distributed_iterator_class()
        if distributed is not None:
            self._input.wrap(distributed, "get_next", inside_function, (tf.errors.OutOfRangeError,))
        self._wrap_gradient(tf.GradientTape, inside_function)
        self._wrap_function_call(pf.Function, inside_function)
        for meth, op in (("save", "save"), ("write", "save"), ("restore", "load"), ("read", "load")):
            self._wrap_ckpt(tf.train.Checkpoint, meth, op)
        self.agent.pollers.append(self._poll_gpu_memory)
        self.agent.info.setdefault("frameworks", []).append(f"tensorflow {tf.__version__}")

    def _wrap_gradient(self, tape_cls: Any, inside_function: Any) -> None:
        """``GradientTape.gradient`` (eager) is ``backward``; traced, it makes the ``tf.function``
        being traced a training step function (variables updated by the job's own code included)."""
        col = self
        agent = self.agent
        steps = agent.steps
        orig_gradient = tape_cls.gradient

        def gradient(tape: Any, *args: Any, **kwargs: Any) -> Any:
            if inside_function():
                col.traced_training()
                return orig_gradient(tape, *args, **kwargs)
            t = agent.tls
            if t.active is not None or not col.enabled:
                return orig_gradient(tape, *args, **kwargs)
            t0 = now_ns()
            t.active = "backward"
            try:
                return orig_gradient(tape, *args, **kwargs)
            finally:
                t.active = None
                try:
                    if col.fault_at:
                        col.inject("gradient")
                    steps.activity(t0)
                    col._phase("backward", t0, now_ns())
                except Exception as exc:
                    agent.fail(col, exc)

        self._set(tape_cls, "gradient", gradient)

    def traced_training(self) -> None:
        """A gradient is computed or applied while a ``tf.function`` called by the job (not by Keras) is
        traced: that function is a training step. MirroredStrategy traces ``strategy.run``'s function
        on one thread per replica, so the function being called is read from the collector, not the
        thread."""
        if self._fn_stack and not self._mode:
            self._train_fns.add(self._fn_stack[0])

    def _wrap_function_call(self, function_cls: Any, inside_function: Any) -> None:
        """A call of a ``tf.function`` whose trace applied gradients is ``compute`` and ends a step."""
        col = self
        agent = self.agent
        steps = agent.steps
        orig_call = function_cls.__call__

        def fn_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            t = agent.tls
            if t.active is not None or not col.enabled or col._mode or inside_function():
                return orig_call(fn, *args, **kwargs)
            t0 = now_ns()
            col._fn_stack.append(id(fn))
            t.active = "compute"
            try:
                return orig_call(fn, *args, **kwargs)
            finally:
                t.active = None
                col._fn_stack.pop()
                try:
                    if id(fn) in col._train_fns:
                        t1 = now_ns()
                        steps.activity(t0)
                        col._phase("compute", t0, t1, {"fused": ["forward", "backward", "optimizer"]})
                        steps.update_done(t1)
                except Exception as exc:
                    agent.fail(col, exc)

        self._set(function_cls, "__call__", fn_call)

    def _wrap_ckpt(self, cls: Any, meth: str, op: str) -> None:
        """``cls.meth`` (a save or load) is a ``checkpoint`` phase, with its path and bytes."""
        col = self
        agent = self.agent
        orig = getattr(cls, meth)

        def ckpt(obj: Any, *args: Any, **kwargs: Any) -> Any:
            t = agent.tls
            if t.active is not None or not col.enabled:
                return orig(obj, *args, **kwargs)
            t0 = now_ns()
            t.active = "checkpoint"
            result = None
            try:
                result = orig(obj, *args, **kwargs)
                return result
            finally:
                t.active = None
                try:
                    if col.fault_at:
                        col.inject("checkpoint")
                    target = args[0] if args else next(iter(kwargs.values()), None)
                    path = result if isinstance(result, str) else target
                    attrs: dict[str, Any] = {"op": op, "api": f"{cls.__name__}.{meth}"}
                    if isinstance(path, (str, os.PathLike)):
                        attrs["path"] = os.path.abspath(os.fspath(path))
                        b = _path_bytes(attrs["path"])
                        if b is not None:
                            attrs["bytes"] = b
                    col._phase("checkpoint", t0, now_ns(), attrs)
                except Exception as exc:
                    agent.fail(col, exc)

        self._set(cls, meth, ckpt)

    def _poll_gpu_memory(self) -> list[tuple[str, dict[str, list[Any]]]]:
        tf = sys.modules.get("tensorflow")
        if tf is None:
            return []
        if self._gpu_names is None:
            try:
                self._gpu_names = [f"GPU:{i}" for i, _ in enumerate(tf.config.list_physical_devices("GPU"))]
            except Exception:
                self._gpu_names = []
        for i, dev in enumerate(self._gpu_names):
            try:
                info = tf.config.experimental.get_memory_info(dev)
            except Exception:
                continue
            self.agent.sample(f"tf.gpu.{i}.mem_current_bytes", float(info.get("current", 0)), self.agent.pid)
            self.agent.sample(f"tf.gpu.{i}.mem_peak_bytes", float(info.get("peak", 0)), self.agent.pid)
        return []

    # -- Keras 3 -----------------------------------------------------------------------------------
    def _patch_keras(self, keras: ModuleType) -> None:
        self.keras_torch = _keras_backend(keras) == "torch"
        callback_cls = _make_callback(keras, self)
        self._wrap_keras_entry(keras, "fit", "fit", callback_cls)
        self._wrap_keras_entry(keras, "evaluate", "evaluate", callback_cls)
        self._wrap_keras_entry(keras, "predict", "predict", callback_cls)

        # on every backend: .keras and .weights.h5 files (ModelCheckpoint calls these)
        for meth, op in (("save", "save"), ("save_weights", "save"), ("load_weights", "load")):
            self._wrap_ckpt(keras.Model, meth, op)

        self._wrap_optimizer("apply_gradients", in_fit=False)
        if self.keras_torch:  # the eager train step calls optimizer.apply itself
            self._wrap_optimizer("apply", in_fit=True)
            self._wrap_keras_symbolic()
        if self.input_timing and not self.keras_torch:
            self._wrap_epoch_iterator()
        self.agent.info.setdefault("frameworks", []).append(f"keras {getattr(keras, '__version__', '?')}")

    def _wrap_keras_entry(self, keras: ModuleType, meth: str, mode: str, callback_cls: Any) -> None:
        """``keras.Model.<meth>`` runs with our callback added to the job's, in ``mode``. On the torch
        backend, a whole ``evaluate`` or ``predict`` is one ``eval`` phase (the torch collector's
        phases stay out of it)."""
        col = self
        agent = self.agent
        steps = agent.steps
        orig = getattr(keras.Model, meth)

        def entry(model: Any, *args: Any, **kwargs: Any) -> Any:
            if not col.enabled:
                return orig(model, *args, **kwargs)
            try:
                if col.fault_at:
                    col.inject("keras_" + mode)
                cbs = kwargs.get("callbacks")
                # fit passes its own CallbackList to the evaluate() it runs for validation:
                # that list already holds our callback, so leave it alone.
                if cbs is None or isinstance(cbs, (list, tuple)):
                    kwargs["callbacks"] = [*(cbs or []), callback_cls(mode)]
                if mode == "fit":
                    col._fit_begins()
            except Exception as exc:
                agent.fail(col, exc)
            t = agent.tls
            whole = mode != "fit" and col.keras_torch and t.active is None and col.enabled
            t0 = now_ns()
            if whole:
                t.active = "eval"
            col._mode.append(mode)
            try:
                return orig(model, *args, **kwargs)
            finally:
                col._mode.pop()
                if whole:
                    t.active = None
                try:
                    if whole:
                        col._phase("eval", t0, now_ns())
                    if mode == "fit":
                        col._fit_ends()
                        steps.end_loop(steps.last_update_ns or now_ns())
                except Exception as exc:
                    agent.fail(col, exc)

        self._set(keras.Model, meth, entry)

    def _fit_begins(self) -> None:
        """``fit`` starts its training loop: what ran before it (Keras builds its model by calling the
        layers on symbolic inputs) opens no step. On the torch backend the end of Keras's DataLoader
        is no epoch meanwhile: the callback counts the epochs."""
        loop = self.agent.steps.mine()
        if not loop.pending_close and not loop.manual:
            loop.start_ns = None
        if self.keras_torch and self._loop_state is None:
            st = torch_state(self.agent)
            if st is not None:
                st.loop_epochs += 1
                self._loop_state = st

    def _fit_ends(self) -> None:
        st, self._loop_state = self._loop_state, None
        if st is not None and "fit" not in self._mode:
            st.loop_epochs -= 1
        elif st is not None:
            self._loop_state = st  # a fit inside a fit (a callback's): the outer one ends it

    def _optimizer_observers(self, opt: Any) -> tuple[list[OptimizerObserver], Any]:
        """The torch collector's optimizer observers, and the view of the Keras optimizer ``opt`` they
        read (one per optimizer, while it lives)."""
        st = self._torch_st
        if st is None:
            st = self._torch_st = torch_state(self.agent)
        if st is None or not st.optimizer_observers:
            return [], None
        try:
            view = self._opt_views.get(opt)
            if view is None:
                view = self._opt_views[opt] = KerasOptimizerView(opt)
        except TypeError:  # not weakly referenceable: a view for this call only
            view = KerasOptimizerView(opt)
        return st.optimizer_observers, view

    def _wrap_keras_symbolic(self) -> None:
        """Torch backend: Keras calls its layers on symbolic inputs (``KerasTensor``) to build a model,
        and before a fit's first step builds its model, loss and metrics from one batch's shapes
        (``Trainer._symbolic_build``: the batch fetched from the training data, the model run on meta
        tensors). None of it is a phase: the torch collector's wrappers pass straight through it, so
        no module call there is a forward and that fetch does not make the training loader an eval
        loader."""
        # keras's own modules: keras is loaded by the job (this runs after it imports it)
        # lazy: the job's framework, imported by the job, never by the agent
        from keras.src.backend.common.keras_tensor import KerasTensor
        from keras.src.layers.layer import Layer
        from keras.src.trainers.trainer import Trainer

        col = self
        agent = self.agent

        def building(orig: Any, symbolic_only: bool) -> Any:
            def call(obj: Any, *args: Any, **kwargs: Any) -> Any:
                t = agent.tls
                if (
                    t.active is not None
                    or not col.enabled
                    or (symbolic_only and not (args and isinstance(args[0], KerasTensor)))
                ):
                    return orig(obj, *args, **kwargs)
                t.active = "keras_build"  # no phase: the torch collector's wrappers pass through
                try:
                    return orig(obj, *args, **kwargs)
                finally:
                    t.active = None

            call.__wrapped__ = orig  # type: ignore[attr-defined]
            return call

        self._set(Layer, "__call__", building(Layer.__call__, True))
        self._set(Trainer, "_symbolic_build", building(Trainer._symbolic_build, False))

    def _wrap_optimizer(self, meth: str, in_fit: bool) -> None:
        """``optimizer.<meth>``: in custom loops (eager) ``optimizer``, ending a step; traced, it makes
        the ``tf.function`` a training step. With ``in_fit``, inside ``fit`` too: the ``optimizer``
        phase of Keras's eager train step (torch backend), whose end the callback marks. On the torch
        backend, the torch collector's optimizer observers (the memory collector) run around it, as
        torch's optimizer hooks run around a torch optimizer's step."""
        # keras's own module: keras is loaded by the job (this runs after it imports it)
        # lazy: the job's framework, imported by the job, never by the agent
        from keras.src.optimizers.base_optimizer import BaseOptimizer

        col = self
        agent = self.agent
        steps = agent.steps
        orig = getattr(BaseOptimizer, meth)

        def apply(opt: Any, *args: Any, **kwargs: Any) -> Any:
            tf = sys.modules.get("tensorflow")
            if tf is not None and tf.inside_function():
                col.traced_training()
                return orig(opt, *args, **kwargs)
            t = agent.tls
            mode = col._mode_now()
            if (
                t.active is not None
                or not col.enabled
                or (mode is not None and (mode, in_fit) != ("fit", True))
            ):
                return orig(opt, *args, **kwargs)
            observers: list[OptimizerObserver] = []
            view = None
            if col.keras_torch:
                try:
                    observers, view = col._optimizer_observers(opt)
                except Exception as exc:
                    agent.fail(col, exc)
            for o in observers:
                o.step_begins(view)
            t0 = now_ns()
            t.active = "optimizer"
            try:
                return orig(opt, *args, **kwargs)
            finally:
                t.active = None
                try:
                    if col.fault_at:
                        col.inject(meth)
                    t1 = now_ns()
                    col._phase("optimizer", t0, t1)
                    if mode is None:
                        steps.optimizer_seen = True
                        steps.update_done(t1)
                except Exception as exc:
                    agent.fail(col, exc)
                for o in observers:
                    o.step_ends(view)

        self._set(BaseOptimizer, meth, apply)

    def _wrap_epoch_iterator(self) -> None:
        """``--tf-input-timing on``: Keras iterates a timed plain Python iterator over the dataset."""
        # keras's own module: keras is loaded by the job (this runs after it imports it)
        # lazy: the job's framework, imported by the job, never by the agent
        from keras.src.backend.tensorflow import trainer as tf_trainer

        col = self
        agent = self.agent
        orig_get_iterator = tf_trainer.TFEpochIterator._get_iterator

        def _get_iterator(it: Any) -> Any:
            ds = orig_get_iterator(it)
            try:
                if getattr(it, "steps_per_execution", 1) == 1 and col.enabled:
                    return _TimedIterable(ds, col)
            except Exception as exc:
                agent.fail(col, exc)
            return ds

        self._set(tf_trainer.TFEpochIterator, "_get_iterator", _get_iterator)


class KerasOptimizerView:
    """A Keras optimizer on the torch backend read as the memory collector reads a torch optimizer:
    ``param_groups`` holds the tensors of the variables it trains (their ``.grad`` the gradients),
    ``state`` the tensors of its own variables (moments, iteration count, learning rate)."""

    __slots__ = ("__weakref__", "_opt")

    def __init__(self, opt: Any) -> None:
        self._opt = weakref.ref(opt)

    @property
    def param_groups(self) -> list[dict[str, list[Any]]]:
        opt = self._opt()
        trained = (getattr(opt, "_trainable_variables", None) or ()) if opt is not None else ()
        return [{"params": [v.value for v in trained]}]

    @property
    def state(self) -> dict[int, dict[str, Any]]:
        opt = self._opt()
        own = (getattr(opt, "variables", None) or ()) if opt is not None else ()
        return {i: {"value": v.value} for i, v in enumerate(own)}


class _TimedIterable:
    """The dataset Keras iterates, yielding batches through a timed plain Python iterator."""

    def __init__(self, dataset: Any, col: TensorFlowCollector) -> None:
        self.dataset = dataset
        self.col = col

    def __iter__(self) -> _TimedIterator:
        return _TimedIterator(iter(self.dataset), self.col)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dataset, name)


class _TimedIterator:
    def __init__(self, it: Any, col: TensorFlowCollector) -> None:
        self.it = it
        self.col = col

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        col = self.col
        t0 = now_ns()
        try:
            return next(self.it)
        except StopIteration:
            # Keras's loop expects TensorFlow's end-of-data error from inside the step function.
            # lazy: the job's framework, imported by the job, never by the agent
            import tensorflow as tf

            raise tf.errors.OutOfRangeError(None, None, "End of sequence")
        finally:
            try:
                t1 = now_ns()
                col._fetch_end = t1
                label = "data_wait" if col._mode_now() == "fit" and not col.agent.tls.active else "eval"
                col._phase(label, t0, t1)
            except Exception as exc:
                col.agent.fail(col, exc)


def _make_callback(keras: ModuleType, col: TensorFlowCollector) -> Any:
    agent = col.agent
    steps = agent.steps

    class HoloprofCallback(keras.callbacks.Callback):  # type: ignore[misc,name-defined,unused-ignore]
        """Steps, epochs and evaluation of a Keras fit/evaluate/predict call."""

        def __init__(self, mode: str) -> None:
            super().__init__()
            self.mode = mode
            self._b0 = 0
            self._e0 = 0
            self._epoch = 0

        def _safe(self, fn: Any, *args: Any) -> None:
            if not col.enabled:
                return
            try:
                if col.fault_at:
                    col.inject("keras_callback")
                fn(*args)
            except Exception as exc:
                agent.fail(col, exc)

        # training batches: a step runs from one batch's begin to the next batch's begin
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._safe(self._train_begin)

        def _train_begin(self) -> None:
            t = now_ns()
            # on torch, the DataLoader's fetch (or the forward) opens the step, from the fetch's start
            if not col.keras_torch or torch_state(agent) is None:
                steps.opener(t)
            self._b0 = t

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self._safe(self._train_end)

        def _train_end(self) -> None:
            t1 = now_ns()
            if not col.keras_torch:  # on torch the step is eager: the torch collector timed its phases
                _fused_compute(col, self._b0, t1)
            steps.optimizer_seen = True
            steps.update_done(t1)

        def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._b0 = now_ns()

        def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
            self._safe(self._eval_end)

        on_predict_batch_begin = on_test_batch_begin
        on_predict_batch_end = on_test_batch_end

        def _eval_end(self) -> None:
            if col.keras_torch:  # the whole evaluate/predict call is one eval phase
                return
            t1 = now_ns()
            t0 = col._fetch_end if col._fetch_end >= self._b0 else self._b0
            col._phase("eval", t0, t1)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._e0 = now_ns()
            self._epoch = epoch

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._safe(self._epoch_end)

        def _epoch_end(self) -> None:
            agent.span("epoch", "epoch", self._e0, now_ns(), -1, {"epoch": self._epoch, "framework": "keras"})

    return HoloprofCallback


def _fused_compute(col: TensorFlowCollector, b0: int, t1: int) -> None:
    """A Keras train batch (compiled: forward, backward and the update fused) that began at ``b0``."""
    if col._fetch_end >= b0:  # the batch was fetched by the timed iterator
        col._phase("compute", col._fetch_end, t1, {"fused": ["forward", "backward", "optimizer"]})
    else:
        col._phase("compute", b0, t1, {"fused": ["data_wait", "forward", "backward", "optimizer"]})
        col.note_in_graph_fetch()


def _keras_backend(keras: ModuleType) -> str:
    """The backend Keras 3 runs on (tensorflow, torch, jax), "" if it cannot say."""
    for where in ("config", "backend"):
        fn = getattr(getattr(keras, where, None), "backend", None)
        if callable(fn):
            try:
                return str(fn())
            except Exception:
                continue
    return ""


def _distributed_iterator_class() -> Any:
    """The base class of the iterators of ``tf.distribute`` datasets, None where it is not found."""
    try:
        # lazy: the job's framework, imported by the job, never by the agent
        from tensorflow.python.distribute import input_lib
    except Exception:
        return None
    cls = getattr(input_lib, "DistributedIteratorBase", None)
    return cls if isinstance(cls, type) and callable(getattr(cls, "get_next", None)) else None

"""PyTorch, always on: steps and phases with no code change.

What is patched (each original kept, each patch undone by ``uninstall``), one module per concern,
installed in this order by :class:`~holoprof.collect.torch.collector.TorchCollector`:

* :mod:`.forward` — ``torch.nn.Module.__call__``: the outermost module call of a thread is
  ``forward`` when autograd is on, ``eval`` under ``no_grad``/``inference_mode``; nested module calls
  pass straight through.
* :mod:`.backward` — ``torch.autograd.backward`` / ``torch.autograd.grad``: ``backward``
  (``Tensor.backward`` calls it).
* :mod:`.optimizer` — the global optimizer step hooks: ``optimizer``. A ``step(closure)`` (LBFGS,
  Lightning's automatic optimization) is a whole iteration: the step starts there, and the closure is
  handed to the optimizer wrapped so that the forward, backward and ``zero_grad`` it runs keep their
  own phases (the optimizer's phase is the rest of the call).
* :mod:`.zero_grad` — ``Optimizer.zero_grad`` and ``Module.zero_grad``: ``optimizer``.
* :mod:`.dataloader` — ``_BaseDataLoaderIter.__next__``: ``data_wait``; a fetch whose batch feeds an
  eval forward counts as ``eval``; the end of a training loader is an epoch boundary (except while a
  framework loop counts the epochs itself: Keras's ``fit`` on the torch backend). The dataset
  fetchers: an ``op`` span ``fetch`` per batch, in the training process and in every DataLoader
  worker.
* :mod:`.distributed` — ``torch.distributed.init_process_group``: the rank.
* :mod:`.worker` — ``_MultiProcessingDataLoaderIter.__init__``: the workers it starts are marked as
  such; a worker started with "spawn" installs only its batch fetches (:mod:`.fetch`).

:mod:`.state` holds what they share (the open phase, the pending batch wait, the loaders' roles and
epochs); :mod:`.device` the device time per phase.

Checkpoints (``torch.save``, ``torch.load``, ``torch.distributed.checkpoint``, safetensors, Hugging
Face, Lightning) are recorded by :mod:`holoprof.collect.checkpoints`.

Only one phase is open per thread at a time: whatever runs inside a phase (a transform module inside
``data_wait``, ``torch.load`` in a dataset) belongs to that phase. On a GPU, device time per phase is
measured with CUDA events recorded at the phase boundaries and resolved on the writer thread; the
device is never synchronized.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from holoprof.collect.torch.collector import TorchCollector

__all__ = ["TorchCollector"]


def __getattr__(name: str) -> type[TorchCollector]:
    """``TorchCollector``, imported on first use: a DataLoader worker imports only :mod:`.worker`
    and :mod:`.fetch` of this package, not the training-step patches."""
    if name == "TorchCollector":
        # lazy: the whole collector, only where it is installed (not in a DataLoader worker)
        from holoprof.collect.torch.collector import TorchCollector

        return TorchCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

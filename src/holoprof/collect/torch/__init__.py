"""PyTorch, always on: steps and phases with no code change (see :mod:`.collector`)."""

from holoprof.collect.torch.collector import TorchCollector

__all__ = ["TorchCollector"]

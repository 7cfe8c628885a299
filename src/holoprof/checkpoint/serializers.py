"""Serializers: how a checkpoint object becomes bytes and back, and which serializer an object gets."""

from __future__ import annotations

import contextlib
import pickle
import sys
from typing import IO, Any, Literal, Protocol, runtime_checkable

from holoprof.checkpoint.errors import CheckpointError
from holoprof.errors import MissingExtraError

SerializerName = Literal["auto", "torch", "pickle"]


@runtime_checkable
class Serializer(Protocol):
    """Turns an object into bytes on a writable file and back. ``name`` is stored in the manifest."""

    name: str

    def dump(self, obj: Any, f: IO[bytes]) -> None: ...

    def load(self, f: IO[bytes], **options: Any) -> Any: ...


class PickleSerializer:
    """``pickle`` with the highest protocol: any picklable object."""

    name = "pickle"

    def dump(self, obj: Any, f: IO[bytes]) -> None:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)

    def load(self, f: IO[bytes], **options: Any) -> Any:
        if options:
            raise CheckpointError(
                f"the pickle serializer takes no load options, got {sorted(options)}; "
                "drop them (map_location and weights_only apply to torch checkpoints only)"
            )
        return pickle.load(f)


class TorchSerializer:
    """``torch.save`` / ``torch.load``. Load options (``map_location``, ``weights_only``) pass through.

    ``weights_only`` defaults to False because these files were written and checksummed by this
    class (state dicts often carry NumPy RNG state, which ``weights_only=True`` refuses); pass
    ``weights_only=True`` to load files of unknown origin safely.
    """

    name = "torch"

    def dump(self, obj: Any, f: IO[bytes]) -> None:
        save = _torch().save
        # the tracer's wrapper would record this background write as a second checkpoint
        getattr(save, "__wrapped__", save)(obj, f)

    def load(self, f: IO[bytes], **options: Any) -> Any:
        options.setdefault("weights_only", False)
        return _torch().load(f, **options)


def _torch() -> Any:
    try:
        import torch  # lazy: torch is an optional, heavy dependency
    except ImportError:
        raise MissingExtraError("the torch checkpoint serializer", "torch") from None
    return torch


def check_serializer(serializer: SerializerName | Serializer) -> SerializerName | Serializer:
    """``serializer`` if it is a valid choice for a BurstBuffer, else raise CheckpointError saying why."""
    if isinstance(serializer, str):
        if serializer not in ("auto", "torch", "pickle"):
            raise CheckpointError(
                f"unknown serializer {serializer!r}; use 'auto', 'torch', 'pickle' or an object "
                "with name, dump(obj, f) and load(f)"
            )
        if serializer == "torch":
            _torch()
        return serializer
    if not isinstance(serializer, Serializer) or not isinstance(getattr(serializer, "name", None), str):
        raise CheckpointError(
            "serializer must be 'auto', 'torch', 'pickle' or an object with a str 'name', "
            "dump(obj, f) and load(f, **options)"
        )
    return serializer


def _builtin_serializer(name: str) -> Serializer | None:
    if name == "pickle":
        return PickleSerializer()
    if name == "torch":
        return TorchSerializer()
    return None


def serializer_for(choice: SerializerName | Serializer, has_tensor: bool) -> Serializer:
    """The serializer that writes an object (``has_tensor``: it holds a torch tensor)."""
    if isinstance(choice, str):
        if choice == "auto":
            choice = "torch" if has_tensor else "pickle"
        found = _builtin_serializer(choice)
        assert found is not None
        return found
    return choice


def serializer_named(choice: SerializerName | Serializer, name: str) -> Serializer:
    """The serializer that reads a checkpoint its manifest says was written by serializer ``name``."""
    if not isinstance(choice, str) and choice.name == name:
        return choice
    found = _builtin_serializer(name)
    if found is None:
        raise CheckpointError(
            f"checkpoint was written with serializer {name!r}; "
            "open the BurstBuffer with that serializer to load it"
        )
    return found


def inspect_object(obj: Any) -> tuple[bool, int]:
    """(contains a torch tensor, estimated serialized size in bytes) from a bounded walk of containers."""
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None)
    has_tensor = False
    total = 0
    seen_storages: set[tuple[int, int]] = set()
    stack: list[tuple[Any, int]] = [(obj, 0)]
    visited = 0
    while stack and visited < 200_000:
        x, depth = stack.pop()
        visited += 1
        if tensor_type is not None and isinstance(x, tensor_type):
            has_tensor = True
            try:
                storage = x.untyped_storage()
                key = (int(storage.data_ptr()), int(storage.nbytes()))
                if key not in seen_storages:
                    seen_storages.add(key)
                    total += key[1]
            except Exception:
                with contextlib.suppress(Exception):
                    total += int(x.element_size() * x.nelement())
        elif isinstance(x, (bytes, bytearray, str)):
            total += len(x)
        elif isinstance(x, memoryview):
            total += x.nbytes
        elif isinstance(x, dict):
            if depth < 10:
                stack.extend((v, depth + 1) for v in x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            if depth < 10:
                stack.extend((v, depth + 1) for v in x)
        else:
            try:
                nbytes = getattr(x, "nbytes", None)  # NumPy arrays and the like
            except Exception:
                nbytes = None
            if isinstance(nbytes, int) and not isinstance(nbytes, bool):
                total += nbytes
    return has_tensor, total

"""The storages that hold a tensor, and how to tell that one was replaced — for a plain tensor and for
a tensor subclass that wraps others (a DTensor, whose own storage cannot be read and whose data
pointer is 0: what it holds is its local shard)."""

from __future__ import annotations

from typing import Any

StorageKey = tuple[int, int]  # (data pointer, bytes) of a storage


def storage_keys(t: Any) -> list[tuple[StorageKey, bool]]:
    """(storage key, on a GPU) of each storage that holds tensor ``t``: its own or, for a tensor
    subclass that wraps others (a DTensor: its local shard), theirs. Raises where a storage cannot be
    read."""
    if hasattr(type(t), "__tensor_flatten__"):
        out: list[tuple[StorageKey, bool]] = []
        for name in t.__tensor_flatten__()[0]:
            inner = getattr(t, name, None)
            if hasattr(inner, "untyped_storage"):
                out.extend(storage_keys(inner))
        return out
    st = t.untyped_storage()
    return [((int(st.data_ptr()), int(st.nbytes())), bool(t.is_cuda))]


def tensor_ptr(t: Any) -> int:
    """The data pointer of ``t`` (of the first tensor it wraps, for a tensor subclass such as DTensor,
    whose own is 0): what tells that a parameter or a gradient was replaced."""
    if hasattr(type(t), "__tensor_flatten__"):
        for name in t.__tensor_flatten__()[0]:
            inner = getattr(t, name, None)
            if hasattr(inner, "untyped_storage"):
                return tensor_ptr(inner)
        return 0
    return int(t.data_ptr())


def storage_bytes(t: Any) -> int:
    """Bytes of the storages that hold ``t`` (0 where they cannot be read)."""
    try:
        return sum(k[1] for k, _ in storage_keys(t))
    except Exception:
        return 0

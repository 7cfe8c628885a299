"""Checkpoints, always on: saves and loads as the frameworks write them, with the final file.

Every call below is a ``checkpoint`` phase span whose attrs say ``op`` (save, load), ``api``, the
``path`` of the final file or directory and its ``bytes`` (after the call, so after any temporary
name has been renamed into place), and, for directories, how many ``files`` the call wrote:

* ``torch.save`` / ``torch.load`` (a path, or a file object's ``name``; bytes only for paths: a file
  object may still hold unflushed bytes), ``torch.distributed.checkpoint`` ``save`` / ``load`` /
  ``async_save`` (the ``checkpoint_id`` directory);
* safetensors: ``safetensors.torch.save_file`` / ``save_model`` / ``load_file`` / ``load_model``;
* Hugging Face: ``PreTrainedModel.save_pretrained`` and ``Trainer.save_model`` (the files the call
  wrote into the directory), ``Trainer._save_checkpoint`` (the whole ``checkpoint-N`` directory:
  model, optimizer, scheduler, RNG state; resuming reads them through ``load_file``/``torch.load``);
* Lightning: ``Trainer.save_checkpoint`` (``ModelCheckpoint`` calls it; bytes in the process that
  writes, global rank 0), ``TorchCheckpointIO.save_checkpoint`` / ``load_checkpoint`` (Fabric, and
  ``Trainer.fit(ckpt_path=...)``), for both ``lightning`` and ``pytorch_lightning``.

Only the outermost call of a thread is recorded (one phase at a time: a ``save_pretrained`` inside
``Trainer._save_checkpoint`` belongs to it). After a save, the job's own ``os.fsync`` of the file (or
of its directory) and ``os.replace`` / ``os.rename`` of it are part of that checkpoint: each is a
``checkpoint`` span with ``part_of`` naming the save's api (a rename also gives the new ``path`` and
its ``bytes``), which the checkpoints section folds into the save. The last 16 files saved by
checkpoint calls are remembered for this, by device and inode.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, Collector, now_ns
from holoprof.agent.setup import post_import_finder
from holoprof.collect.util import path_bytes

#: Files saved by checkpoint calls that the job's fsync/rename may still refer to.
RECENT_SAVES = 16

#: (module, class or None, attribute, op, api, target) for every patched call; ``target(args,
#: kwargs)`` gives what the call writes or reads (see :class:`Target`).
_Spec = tuple[str, str | None, str, str, str, Callable[[tuple[Any, ...], dict[str, Any]], "Target"]]


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


def _local_path(p: Any) -> str | None:
    """The absolute path of a path argument (str or os.PathLike; not a URL), else None."""
    if isinstance(p, (str, os.PathLike)):
        s = os.fspath(p)
        if isinstance(s, str) and s and "://" not in s:
            return os.path.abspath(s)
    return None


def _listing(d: str) -> dict[str, tuple[int, int]]:
    """Regular files directly in ``d``: name -> (size, mtime_ns)."""
    out: dict[str, tuple[int, int]] = {}
    try:
        with os.scandir(d) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        out[e.name] = (st.st_size, st.st_mtime_ns)
                except OSError:
                    continue
    except OSError:
        pass
    return out


class Target:
    """What a checkpoint call writes or reads: a file (``path``), or the files it writes into a
    directory (``directory``: compared with its listing before the call)."""

    def __init__(
        self,
        path: str | None = None,
        *,
        directory: str | None = None,
        sized: bool = True,
        resolve: Callable[[], str | None] | None = None,
    ) -> None:
        self.path = path
        self.directory = directory
        self.sized = sized  # bytes are known only once the call returns with a path (not a file object)
        self.resolve = resolve  # the path, known only after the call
        self.before = _listing(directory) if directory else None

    def attrs(self, op: str) -> dict[str, Any]:
        a: dict[str, Any] = {}
        if self.directory is not None and self.before is not None:
            after = _listing(self.directory)
            changed = {k: v for k, v in after.items() if self.before.get(k) != v}
            a["path"] = self.directory
            a["bytes"] = sum(v[0] for v in changed.values())
            a["files"] = len(changed)
            return a
        path = self.resolve() if self.resolve is not None else self.path
        if path is None:
            return a
        a["path"] = path
        if self.sized:
            size = path_bytes(path)
            if size is not None:
                a["bytes"] = size
        return a


# --- targets of each API -----------------------------------------------------------------------------
def _file_target(i: int, name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Target]:
    def target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Target:
        f = _arg(args, kwargs, i, name)
        p = _local_path(f)
        if p is not None:
            return Target(p)
        n = getattr(f, "name", None)  # an open file: its name, but not its size yet
        return Target(_local_path(n) if isinstance(n, str) else None, sized=False)

    return target


def _dcp_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Target:
    return Target(_local_path(kwargs.get("checkpoint_id")))


def _dir_target(i: int, name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Target]:
    def target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Target:
        return Target(directory=_local_path(_arg(args, kwargs, i, name)))

    return target


def _hf_save_model(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Target:
    trainer = args[0]
    out = _arg(args, kwargs, 1, "output_dir") or getattr(getattr(trainer, "args", None), "output_dir", None)
    return Target(directory=_local_path(out))


def _hf_checkpoint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Target:
    """``Trainer._save_checkpoint``: the ``checkpoint-<global step>`` directory it makes under the
    output directory (or under a run directory of it, in a hyperparameter search)."""
    trainer = args[0]

    def resolve() -> str | None:
        root = _local_path(getattr(getattr(trainer, "args", None), "output_dir", None))
        step = getattr(getattr(trainer, "state", None), "global_step", None)
        if root is None or step is None:
            return None
        name = f"checkpoint-{step}"
        cands = [os.path.join(root, name)]
        try:
            cands += [os.path.join(root, d, name) for d in sorted(os.listdir(root))]
        except OSError:
            pass
        found = [c for c in cands if os.path.isdir(c)]
        return max(found, key=os.path.getmtime) if found else None

    return Target(resolve=resolve)


def _lightning_save(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Target:
    """``Trainer.save_checkpoint(filepath)``: every rank calls it, global rank 0 writes the file."""
    writes = bool(getattr(args[0], "is_global_zero", True))
    return Target(_local_path(_arg(args, kwargs, 1, "filepath")), sized=writes)


_TORCH: list[_Spec] = [
    ("torch", None, "save", "save", "torch.save", _file_target(1, "f")),
    ("torch", None, "load", "load", "torch.load", _file_target(0, "f")),
]
_OTHERS: list[_Spec] = [
    *(
        ("torch.distributed.checkpoint", None, m, op, f"torch.distributed.checkpoint.{m}", _dcp_target)
        for m, op in (("save", "save"), ("load", "load"), ("async_save", "save"))
    ),
    (
        "safetensors.torch",
        None,
        "save_file",
        "save",
        "safetensors.torch.save_file",
        _file_target(1, "filename"),
    ),
    (
        "safetensors.torch",
        None,
        "save_model",
        "save",
        "safetensors.torch.save_model",
        _file_target(1, "filename"),
    ),
    (
        "safetensors.torch",
        None,
        "load_file",
        "load",
        "safetensors.torch.load_file",
        _file_target(0, "filename"),
    ),
    (
        "safetensors.torch",
        None,
        "load_model",
        "load",
        "safetensors.torch.load_model",
        _file_target(1, "filename"),
    ),
    (
        "transformers.modeling_utils",
        "PreTrainedModel",
        "save_pretrained",
        "save",
        "transformers.PreTrainedModel.save_pretrained",
        _dir_target(1, "save_directory"),
    ),
    (
        "transformers.trainer",
        "Trainer",
        "save_model",
        "save",
        "transformers.Trainer.save_model",
        _hf_save_model,
    ),
    (
        "transformers.trainer",
        "Trainer",
        "_save_checkpoint",
        "save",
        "transformers.Trainer._save_checkpoint",
        _hf_checkpoint,
    ),
]
for _pkg, _api in (("lightning.pytorch", "lightning"), ("pytorch_lightning", "pytorch_lightning")):
    _OTHERS.append(
        (
            f"{_pkg}.trainer.trainer",
            "Trainer",
            "save_checkpoint",
            "save",
            f"{_api}.Trainer.save_checkpoint",
            _lightning_save,
        )
    )
for _pkg, _api in (("lightning.fabric", "lightning"), ("lightning_fabric", "lightning_fabric")):
    _OTHERS += [
        (
            f"{_pkg}.plugins.io.torch_io",
            "TorchCheckpointIO",
            "save_checkpoint",
            "save",
            f"{_api}.TorchCheckpointIO.save_checkpoint",
            _file_target(2, "path"),
        ),
        (
            f"{_pkg}.plugins.io.torch_io",
            "TorchCheckpointIO",
            "load_checkpoint",
            "load",
            f"{_api}.TorchCheckpointIO.load_checkpoint",
            _file_target(1, "path"),
        ),
    ]


class _Saved:
    """A file a checkpoint call wrote: where it is now, and its identity."""

    __slots__ = ("api", "dir_id", "file_id", "path")

    def __init__(self, path: str, api: str) -> None:
        self.path = path
        self.api = api
        self.file_id = self.dir_id = (-1, -1)
        self.refresh()

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
            self.file_id = (st.st_dev, st.st_ino)
            dt = os.stat(os.path.dirname(self.path) or ".")
            self.dir_id = (dt.st_dev, dt.st_ino)
        except OSError:
            pass


class CheckpointCollector(Collector):
    name = "checkpoint"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._recent: list[_Saved] = []

    def install(self) -> None:
        finder = post_import_finder()
        modules: dict[str, list[_Spec]] = {}
        for spec in [*_TORCH, *_OTHERS]:
            modules.setdefault(spec[0], []).append(spec)
        for module, specs in modules.items():
            finder.add(module, self._hook(specs))
        self._patch_os()

    def after_fork_child(self) -> None:
        self._recent = []

    def _hook(self, specs: list[_Spec]) -> Callable[[ModuleType], None]:
        return lambda module: self._patch_module(module, specs)

    def _patch_module(self, module: ModuleType, specs: list[_Spec]) -> None:
        if not self.enabled:
            return
        try:
            for _, cls_name, attr, op, api, target in specs:
                owner: Any = getattr(module, cls_name) if cls_name else module
                orig = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
                if orig is None or getattr(orig, "__holoprof_checkpoint__", False):
                    continue
                self._set(owner, attr, self._wrap(orig, op, api, target))
        except Exception as exc:
            self.agent.fail(self, exc)

    # -- the wrapper ---------------------------------------------------------------------------------
    def _wrap(
        self,
        orig: Callable[..., Any],
        op: str,
        api: str,
        target: Callable[[tuple[Any, ...], dict[str, Any]], Target],
    ) -> Callable[..., Any]:
        col = self
        agent = self.agent

        def ckpt(*args: Any, **kwargs: Any) -> Any:
            t = agent.tls
            if t.active is not None or not col.enabled:
                return orig(*args, **kwargs)
            try:
                tgt = target(args, kwargs)
            except Exception as exc:
                agent.fail(col, exc)
                return orig(*args, **kwargs)
            t0 = now_ns()
            t.active = "checkpoint"
            try:
                return orig(*args, **kwargs)
            finally:
                t.active = None
                try:
                    t1 = now_ns()
                    if col.fault_at:
                        col.inject(op)  # "save" or "load"
                    attrs: dict[str, Any] = {"op": op, "api": api, **tgt.attrs(op)}
                    agent.span("phase", "checkpoint", t0, t1, agent.steps.index, attrs)
                    path = attrs.get("path")
                    if op == "save" and isinstance(path, str) and os.path.isfile(path):
                        col._remember(path, api)
                except Exception as exc:
                    agent.fail(col, exc)

        ckpt.__wrapped__ = orig  # type: ignore[attr-defined]
        ckpt.__doc__ = orig.__doc__
        ckpt.__name__ = getattr(orig, "__name__", "checkpoint")
        ckpt.__holoprof_checkpoint__ = True  # type: ignore[attr-defined]
        return ckpt

    def _remember(self, path: str, api: str) -> None:
        keep = [s for s in self._recent if s.path != path][-(RECENT_SAVES - 1) :]
        self._recent = [*keep, _Saved(path, api)]

    # -- the job's own fsync / rename of a checkpoint it has just saved ------------------------------
    def _patch_os(self) -> None:
        col = self
        agent = self.agent
        o_fsync, o_replace, o_rename = os.fsync, os.replace, os.rename

        def part(t0: int, saved: _Saved, api: str, extra: dict[str, Any]) -> None:
            attrs = {"op": "save", "api": api, "path": saved.path, "part_of": saved.api, **extra}
            agent.span("phase", "checkpoint", t0, now_ns(), agent.steps.index, attrs)

        def fsync(fd: Any) -> None:
            saved = None
            size: int | None = None
            if col._recent and col.enabled and agent.tls.active is None:
                try:
                    n = fd if isinstance(fd, int) else fd.fileno()
                    st = os.fstat(n)
                    ident = (st.st_dev, st.st_ino)
                    saved = next((s for s in reversed(col._recent) if ident in (s.file_id, s.dir_id)), None)
                    size = st.st_size if saved is not None and ident == saved.file_id else None
                except Exception:
                    saved = None
            if saved is None:
                return o_fsync(fd)
            t0 = now_ns()
            agent.tls.active = "checkpoint"
            try:
                return o_fsync(fd)
            finally:
                agent.tls.active = None
                try:
                    part(t0, saved, "os.fsync", {} if size is None else {"bytes": size})
                except Exception as exc:
                    agent.fail(col, exc)

        def renamer(orig: Callable[..., Any], api: str) -> Callable[..., Any]:
            def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
                saved = None
                if col._recent and col.enabled and agent.tls.active is None and not args and not kwargs:
                    p = _local_path(src)
                    saved = next((s for s in reversed(col._recent) if s.path == p), None)
                if saved is None:
                    return orig(src, dst, *args, **kwargs)
                t0 = now_ns()
                agent.tls.active = "checkpoint"
                try:
                    return orig(src, dst)
                finally:
                    agent.tls.active = None
                    try:
                        old, new = saved.path, _local_path(dst)
                        if new is not None and os.path.isfile(new):
                            saved.path = new
                            saved.refresh()
                            size = path_bytes(new)
                            part(t0, saved, api, {"renamed_from": old, **({"bytes": size} if size else {})})
                    except Exception as exc:
                        agent.fail(col, exc)

            rename.__wrapped__ = orig  # type: ignore[attr-defined]
            rename.__doc__ = orig.__doc__
            return rename

        fsync.__wrapped__ = o_fsync  # type: ignore[attr-defined]
        fsync.__doc__ = o_fsync.__doc__
        self._set(os, "fsync", fsync)
        self._set(os, "replace", renamer(o_replace, "os.replace"))
        self._set(os, "rename", renamer(o_rename, "os.rename"))


def collector(agent: Agent) -> CheckpointCollector:
    return CheckpointCollector(agent)

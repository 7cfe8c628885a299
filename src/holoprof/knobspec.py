"""The knobs ``holoprof run --set`` and ``holoprof sweep --set`` apply inside a job: their names and
how their values are written (shared by the commands and the agent that applies them)."""

from __future__ import annotations

from typing import Any

from holoprof.errors import HoloprofError

LOADER_KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "batch_size")
TF_KNOBS = ("num_parallel_calls", "prefetch")
KNOBS = (*LOADER_KNOBS, "torch_threads", *TF_KNOBS, "omp_wait_policy", "matmul_precision", "autocast")
OMP_POLICIES = ("passive", "active", "default")
#: ``torch.set_float32_matmul_precision`` values
MATMUL_PRECISIONS = ("highest", "high", "medium")
#: ``autocast`` values: the model's forward as the job wrote it, or under bfloat16 autocast
AUTOCAST = ("off", "bf16")
_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_value(name: str, text: str) -> Any:
    """The typed value of knob ``name`` written as ``text``; HoloprofError naming the fix if invalid."""
    t = text.strip().lower()
    if name not in KNOBS:
        raise HoloprofError(f"unknown knob {name!r}; knobs are: {', '.join(KNOBS)}")
    if name in ("pin_memory", "persistent_workers"):
        if t not in _BOOL:
            raise HoloprofError(f"bad value {text!r} for {name}: write true or false")
        return _BOOL[t]
    if name == "omp_wait_policy":
        if t not in OMP_POLICIES:
            raise HoloprofError(f"bad value {text!r} for omp_wait_policy: write passive, active or default")
        return t
    if name == "matmul_precision":
        if t not in MATMUL_PRECISIONS:
            raise HoloprofError(f"bad value {text!r} for matmul_precision: write highest, high or medium")
        return t
    if name == "autocast":
        if t not in AUTOCAST:
            raise HoloprofError(f"bad value {text!r} for autocast: write off or bf16")
        return t
    if name in TF_KNOBS and t == "autotune":
        return "autotune"
    low = 0 if name == "num_workers" else 1
    try:
        v = int(t)
    except ValueError:
        v = low - 1
    if v < low:
        extra = " or autotune" if name in TF_KNOBS else ""
        raise HoloprofError(f"bad value {text!r} for {name}: write an integer >= {low}{extra}")
    return v


def parse_assignments(specs: list[str], flag: str = "--set") -> dict[str, list[Any]]:
    """``["num_workers=0,2", "pin_memory=true"]`` -> ``{"num_workers": [0, 2], "pin_memory": [True]}``."""
    out: dict[str, list[Any]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not values.strip():
            raise HoloprofError(
                f"bad {flag} {spec!r}: write KNOB=VALUE[,VALUE...], e.g. {flag} num_workers=0,2"
            )
        if name in out:
            raise HoloprofError(f"{flag} {name} is given twice; list all its values in one: {name}=a,b")
        out[name] = [parse_value(name, v) for v in values.split(",")]
    return out


def text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)

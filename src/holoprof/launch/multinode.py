"""Does this ``holoprof run`` look like one launcher of several (one per node of a job)?

Used for advice only: a launcher without ``--join`` given a run directory that another launcher has
taken is refused, and the refusal says to add ``--join`` when the job looks multi-node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: launchers that start the job's processes on several nodes themselves
_FAN_OUT = ("mpirun", "mpiexec", "orterun", "srun", "prun", "aprun", "jsrun")
#: (variable, what it says) set by schedulers and MPI launchers in the processes they start
_SIZE_VARIABLES = (
    ("SLURM_NNODES", "a Slurm job on {n} nodes"),
    ("SLURM_JOB_NUM_NODES", "a Slurm job on {n} nodes"),
    ("OMPI_COMM_WORLD_SIZE", "an MPI job of {n} processes"),
    ("PMI_SIZE", "an MPI job of {n} processes"),
    ("PMIX_SIZE", "an MPI job of {n} processes"),
)
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _nnodes(value: str) -> int:
    """The largest node count of torchrun's ``--nnodes N`` or ``--nnodes MIN:MAX``."""
    return max((_int(v) for v in value.split(":")), default=0)


def torchrun_nodes(command: list[str]) -> int:
    """``--nnodes`` of a torchrun command line (``torchrun``, ``python -m torch.distributed.run``);
    0 when it is not one or does not say."""
    if not any(os.path.basename(a) in _TORCHRUN or a in _TORCHRUN for a in command[:3]):
        return 0
    for i, a in enumerate(command):
        if a in ("--nnodes", "--nnodes_") and i + 1 < len(command):
            return _nnodes(command[i + 1])
        if a.startswith("--nnodes="):
            return _nnodes(a.partition("=")[2])
    return 0


def multi_node_hint(command: list[str], environ: Mapping[str, str] | None = None) -> str | None:
    """How ``command`` (run in ``environ``) looks like one node of a multi-node job, in words
    (``torchrun --nnodes 2``, ``a Slurm job on 4 nodes``), or None."""
    env = os.environ if environ is None else environ
    for var, what in _SIZE_VARIABLES:
        n = _int(env.get(var, ""))
        if n > 1:
            return f"{what.format(n=n)}, {var}={n}"
    n = torchrun_nodes(command)
    if n > 1:
        return f"torchrun --nnodes {n}"
    if command and os.path.basename(command[0]) in _FAN_OUT:
        return f"{os.path.basename(command[0])} starts the job on several nodes"
    return None

"""A DDP job on gloo for the communication tests, launched by torchrun or ``spawn PORT WORLD``.

Options (environment): ``DDP_STEPS`` (default 6), ``DDP_SLOW_RANK`` / ``DDP_SLOW_S`` (that rank sleeps
before each step: a straggler; with ``DDP_SLOW_IN=forward``, inside its forward pass instead),
``DDP_TRUTH_DIR`` (each rank writes ``rank<N>.json`` there: its own timer of each step, from the top
of the loop to the end of the step, and of each delay it slept), ``DDP_DIE_RANK`` / ``DDP_DIE_STEP`` (that rank leaves with
``os._exit(3)``, or SIGKILL with ``DDP_DIE_SIGNAL=KILL``, or an uncaught exception with ``RAISE``,
after that many steps, ``DDP_DIE_DELAY_S``
seconds into the next; the process group has a short timeout so the others fail too),
``DDP_USER_HOOK=1`` (register a comm hook of the job's own), ``DDP_SYNC_ALLREDUCE=1`` (an extra
synchronous all_reduce of the loss per step, outside any phase: exposed communication),
``DDP_BUCKET_CAP_MB`` (DDP's bucket size: a small one gives several buckets per step, in flight
together), ``DDP_COLLECTIVES=1`` (after training: broadcast, all_gather, async all_reduce, isend/irecv, barrier),
``DDP_HARD_EXIT=1`` (leave with ``os._exit(0)`` once the group is destroyed: an untraced gloo process
aborts in about one run in eight at interpreter exit, "terminate called without an active exception",
after its work is done; untraced reference runs use it so that only the training is compared).
"""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def train(rank: int, world: int) -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT_S", "60")))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    steps = int(os.environ.get("DDP_STEPS", "6"))
    slow = int(os.environ.get("DDP_SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("DDP_SLOW_S", "0.05"))
    die = int(os.environ.get("DDP_DIE_RANK", "-1"))
    die_step = int(os.environ.get("DDP_DIE_STEP", "3"))
    torch.manual_seed(0)
    cap = os.environ.get("DDP_BUCKET_CAP_MB")  # small: several buckets in flight at once
    model = DistributedDataParallel(build(), **({"bucket_cap_mb": float(cap)} if cap else {}))
    calls = []
    if os.environ.get("DDP_USER_HOOK") == "1":

        def my_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            calls.append(bucket.index())
            buf = bucket.buffer().div_(world)
            fut = dist.all_reduce(buf, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        model.register_comm_hook(None, my_hook)
    slept: list[float] = []  # each delay as long as it really was (a busy machine oversleeps)

    def delay() -> None:
        t = time.perf_counter()
        time.sleep(slow_s)
        slept.append(time.perf_counter() - t)

    slow_in_forward = rank == slow and os.environ.get("DDP_SLOW_IN") == "forward"
    if slow_in_forward:  # inside DDP's forward: the first layer sleeps before it runs
        model.module[0].register_forward_pre_hook(lambda mod, args: delay())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    loss = torch.zeros(())
    step_times = []
    for i in range(steps):
        t0 = time.perf_counter()
        if rank == die and i == die_step:
            time.sleep(float(os.environ.get("DDP_DIE_DELAY_S", "0")))
            print(f"rank {rank} dies at step {i}", flush=True)
            if os.environ.get("DDP_DIE_SIGNAL") == "KILL":
                os.kill(os.getpid(), signal.SIGKILL)
            if os.environ.get("DDP_DIE_SIGNAL") == "RAISE":  # the commonest way: an uncaught exception
                raise RuntimeError(f"rank {rank} fails at step {i}")
            os._exit(3)
        if rank == slow and not slow_in_forward:
            delay()
        x = torch.randn(16, 32, generator=g)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if os.environ.get("DDP_SYNC_ALLREDUCE") == "1":
            dist.all_reduce(loss.detach().clone())
        step_times.append(time.perf_counter() - t0)
    if os.environ.get("DDP_TRUTH_DIR"):
        truth = {"rank": rank, "step_s": step_times, "delay_s": slept}
        with open(os.path.join(os.environ["DDP_TRUTH_DIR"], f"rank{rank}.json"), "w") as f:
            json.dump(truth, f)
    if os.environ.get("DDP_COLLECTIVES") == "1":
        collectives(rank, world)
    if calls:
        print(f"rank {rank} user hook calls {len(calls)}", flush=True)
    print(f"rank {rank} final loss {loss.item():.6f}", flush=True)
    dist.barrier()  # leave together: gloo can abort a rank whose peer tears the group down first
    dist.destroy_process_group()
    if os.environ.get("DDP_HARD_EXIT") == "1":
        sys.stdout.flush()
        os._exit(0)


def collectives(rank: int, world: int) -> None:
    """One call of several collectives: sizes are known (float32: 4 bytes per element)."""
    t = torch.ones(100)
    dist.broadcast(t, src=0)
    out = [torch.zeros(100) for _ in range(world)]
    dist.all_gather(out, t)
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    work.wait()
    if rank in (0, 1):
        buf = torch.zeros(50)
        w = dist.isend(torch.ones(50), dst=1) if rank == 0 else dist.irecv(buf, src=0)
        w.wait()
    dist.barrier()


def spawned(rank: int, world: int, port: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    train(rank, world)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "spawn":
        import torch.multiprocessing as mp

        mp.spawn(spawned, args=(int(sys.argv[3]), sys.argv[2]), nprocs=int(sys.argv[3]), join=True)
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))

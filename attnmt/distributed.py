"""Data-parallel training with PyTorch's own engine, started by ``torchrun``.

``torchrun --nproc-per-node N -m attnmt train CONFIG`` sets ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``; :func:`init_cluster` joins the process group (``gloo`` on CPU, ``nccl``
on CUDA) with a timeout, so a rank that dies ends the job instead of hanging it.
With one process every helper here is a no-op.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Cluster:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def launched_world() -> int:
    """The number of processes ``torchrun`` started for this job (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_cluster(device_type: str, timeout_minutes: float = 30.0) -> Cluster:
    """Join the process group that ``torchrun`` describes in the environment, if any.

    On CUDA each process first takes the GPU of its local rank, so that collective
    operations (and the tensors of ``broadcast_object_list``) use that GPU, not GPU 0.
    """
    if launched_world() == 1:
        return Cluster()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = None
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                timeout=timedelta(minutes=timeout_minutes), device_id=device)
    return Cluster(dist.get_rank(), dist.get_world_size(), local_rank)


def shard_batches(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This rank's batches of an epoch: every ``world``-th batch, the same count on every rank.

    The batches of the last incomplete round are pooled and their examples dealt out one
    per rank in turn, so each pair is still seen once per epoch. Only when fewer pairs
    than ranks are left over do some ranks repeat one of them (all ranks must step together).
    """
    if world == 1:
        return batches
    full_rounds = len(batches) - len(batches) % world
    shard = batches[rank:full_rounds:world]
    leftover = [index for batch in batches[full_rounds:] for index in batch]
    if leftover:
        shard.append(leftover[rank::world] or [leftover[rank % len(leftover)]])
    return shard


def all_reduce_sum(values: list[float], cluster: Cluster, device: torch.device) -> list[float]:
    """Sum of ``values`` over all ranks (every rank gets the result)."""
    if not cluster.active:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def broadcast_object(value, cluster: Cluster):
    """Rank 0's ``value`` on every rank."""
    if not cluster.active:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather_objects(value, cluster: Cluster) -> list:
    """Every rank's ``value``, in rank order, on every rank."""
    if not cluster.active:
        return [value]
    values = [None] * cluster.world
    dist.all_gather_object(values, value)
    return values


def barrier(cluster: Cluster) -> None:
    if cluster.active:
        dist.barrier()


def shutdown(cluster: Cluster) -> None:
    if cluster.active and dist.is_initialized():
        dist.destroy_process_group()


def finish_worker(code: int) -> int:
    """End a ``torchrun`` worker now with ``code``, once its work is saved and its process
    group destroyed; in a single process, return ``code``.

    At interpreter exit after a finished gloo job, PyTorch's C++ teardown sometimes aborts
    one rank ("terminate called without an active exception", SIGABRT), and torchrun then
    reports the whole job as failed. ``os._exit`` skips that teardown; every file the run
    writes is closed or flushed by then, and the standard streams are flushed here.
    """
    if launched_world() == 1:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""Data-parallel training with PyTorch's own engine, started by ``torchrun``.

``torchrun --nproc-per-node N -m attnmt train CONFIG`` sets ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``; :func:`init_cluster` joins the process group (``gloo`` on CPU, ``nccl``
on CUDA) with a timeout, so a rank that dies ends the job instead of hanging it.
With one process every helper here is a no-op.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from attnmt.errors import UserError


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


def init_cluster(device_type: str, timeout_minutes: float = 30.0) -> Cluster:
    """Join the process group that ``torchrun`` describes in the environment, if any."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Cluster()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                timeout=timedelta(minutes=timeout_minutes))
    return Cluster(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


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


# --- devices and precision ---------------------------------------------------------------------

def resolve_precision(precision: str, device: torch.device,
                      setting: str = "train.precision") -> torch.dtype | None:
    """The autocast dtype, or None for float32; ``setting`` names the option in errors.

    ``auto``: bf16 where the hardware runs it natively (AVX-512 BF16 or AMX CPUs, Ampere+
    GPUs), fp16 (with gradient scaling) on older GPUs, float32 on other CPUs. Explicit bf16
    elsewhere is refused: emulated, it is several times slower than float32.
    """
    if precision == "fp32":
        return None
    if device.type == "cuda":
        bf16 = torch.cuda.is_bf16_supported()
    else:
        bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    if precision == "fp16":
        if device.type != "cuda":
            raise UserError(f"{setting}: fp16 needs a CUDA device; use bf16 or fp32 on CPU")
        return torch.float16
    if precision == "bf16" and not bf16:
        raise UserError(f"{setting}: bf16 is not supported on this {device.type}; use fp32")
    if bf16:
        return torch.bfloat16
    return torch.float16 if device.type == "cuda" else None


def keep_freed_memory() -> None:
    """Make glibc keep freed memory for the next allocation instead of unmapping it.

    glibc serves blocks over 32 MiB (a beam batch's vocabulary log-probabilities and
    key/value caches) with fresh ``mmap`` pages, so every such tensor pays a page fault
    per 4 KiB before any arithmetic. Turning ``mmap`` off and trimming only above 1 GiB
    lets those blocks be reused: beam-5 decoding of the 1000 test sentences had 5x fewer
    page faults and ran about 10% faster on 2 cores (README, "Results on Multi30k"). Blocks
    too big for a thread's arena are then served from the main one. A no-op where the C
    library is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_max = -1, -4                      # from glibc's <malloc.h>
    libc.mallopt(m_mmap_max, 0)
    libc.mallopt(m_trim_threshold, 1 << 30)


def resolve_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device: cuda requested but no CUDA device is available")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)

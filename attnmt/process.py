"""Process settings a command chooses, and the device and precision a run uses.

Nothing here runs on import or when a model is loaded: the command-line entry points
call :func:`configure` (library users may call it too). It sets the CPU threads (all
cores, divided among the processes ``torchrun`` starts on this machine, unless the user
chose), caps oneDNN's cache of compiled kernels, and makes glibc keep freed memory.
"""

from __future__ import annotations

import ctypes
import os

import torch

from attnmt.config import DEVICES, PRECISIONS
from attnmt.errors import UserError


def configure(threads: int = 0) -> int:
    """Apply the settings attnmt's commands run with; returns the number of CPU threads.

    oneDNN compiles a bf16 matmul kernel (about 3 ms with AMX, where running it takes
    0.5 ms) for each input shape and caches up to 1024 of them. Token batches of exact
    lengths come in hundreds of shapes per epoch: the cache grew resident memory past
    5 GiB in 250 training steps, and a small cache recompiled on most products. Padded to
    a multiple of 8 (``train.pad_multiple``), an epoch's batches take a few dozen shapes,
    whose kernels 256 entries hold at about 1 GiB. The variable is read when oneDNN
    builds its first kernel, so this must run before that.

    Subnormal floats (below 1.2e-38) are flushed to zero: as training converges, small
    gradients and Adam's second moments fall into that range, where the CPU's arithmetic
    is many times slower; a bf16 Transformer step at update 15,000 took 227 ms with them
    and 209 ms without (records/performance.md). No result changes measurably.
    """
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")
    torch.set_flush_denormal(True)
    keep_freed_memory()
    threads = threads or default_threads()
    torch.set_num_threads(threads)
    return threads


def default_threads() -> int:
    """All cores of this machine, shared among the processes torchrun started on it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, (cores or 1) // local_world)


def keep_freed_memory() -> None:
    """Make glibc keep freed memory for the next allocation instead of unmapping it.

    glibc serves blocks over 32 MiB (a beam batch's vocabulary log-probabilities and
    key/value caches, the logits of the training loss) with fresh ``mmap`` pages, so every
    such tensor pays a page fault per 4 KiB before any arithmetic. Turning ``mmap`` off
    and trimming only above 1 GiB lets those blocks be reused: beam-5 decoding of 1,000
    test sentences had 5x fewer page faults and ran about 10% faster on 2 cores, bf16
    training about 6% faster (records/performance.md). Blocks too big for a thread's arena
    are then served from the main one. A no-op where the C library is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_max = -1, -4                      # from glibc's <malloc.h>
    libc.mallopt(m_mmap_max, 0)
    libc.mallopt(m_trim_threshold, 1 << 30)


def resolve_device(device: str, setting: str = "train.device") -> torch.device:
    """``auto``: CUDA when available, else the CPU; ``cuda`` without a GPU is refused."""
    if device not in DEVICES:
        raise UserError(f"{setting} must be one of {', '.join(DEVICES)}; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{setting}: cuda requested but no CUDA device is available")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matrix products run in hardware: AVX-512 BF16 or AMX on CPUs, compute
    capability 8.0+ (Ampere) on GPUs. ``torch.cuda.is_bf16_supported()`` also counts the
    emulated bf16 of older GPUs (T4, V100), so it is not asked."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve_precision(precision: str, device: torch.device,
                      setting: str = "train.precision") -> torch.dtype | None:
    """The autocast dtype, or None for float32; ``setting`` names the option in errors.

    ``auto``: bf16 where the hardware runs it natively, fp16 (with gradient scaling) on
    older GPUs, float32 on other CPUs. Explicit bf16 elsewhere is refused: emulated, it
    is several times slower than float32.
    """
    if precision not in PRECISIONS:
        raise UserError(f"{setting} must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if precision == "fp32":
        return None
    if precision == "fp16":
        if device.type != "cuda":
            raise UserError(f"{setting}: fp16 needs a CUDA device; use bf16 or fp32 on CPU")
        return torch.float16
    bf16 = native_bf16(device)
    if precision == "bf16" and not bf16:
        raise UserError(f"{setting}: bf16 is not supported on this {device.type}; use fp32")
    if bf16:
        return torch.bfloat16
    return torch.float16 if device.type == "cuda" else None

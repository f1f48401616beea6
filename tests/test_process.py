import pytest
import torch

from attnmt.errors import UserError
from attnmt.process import configure, default_threads, resolve_device, resolve_precision


def test_precision_selection(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_precision("fp32", cpu) is None
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert resolve_precision("auto", cpu) is torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert resolve_precision("auto", cpu) is None
    with pytest.raises(UserError, match="bf16 is not supported on this cpu"):
        resolve_precision("bf16", cpu)
    with pytest.raises(UserError, match="fp16 needs a CUDA device"):
        resolve_precision("fp16", cpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)    # counts emulated bf16
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))   # T4
    assert resolve_precision("auto", cuda) is torch.float16
    with pytest.raises(UserError, match="bf16 is not supported on this cuda"):
        resolve_precision("bf16", cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))   # A100
    assert resolve_precision("auto", cuda) is torch.bfloat16
    with pytest.raises(UserError, match="^train.precision must be one of auto, fp32, bf16, fp16; got 'fp8'$"):
        resolve_precision("fp8", cpu)


def test_device_selection(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(UserError, match="cuda requested but no CUDA device is available"):
        resolve_device("cuda")


def test_threads_are_shared_among_the_processes_of_a_machine(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_threads() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")                   # torchrun --nproc-per-node 2
    assert default_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert default_threads() == 1


def test_configure_sets_threads_only_when_called():
    before = torch.get_num_threads()
    import attnmt.translator  # noqa: F401  (importing and loading never change the process)
    assert torch.get_num_threads() == before
    try:
        assert configure(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_configure_flushes_subnormal_floats_to_zero():
    try:
        torch.set_flush_denormal(False)
        subnormal = torch.tensor([1e-39])                   # below float32's 1.18e-38
        assert (subnormal * 1.0).item() > 0
        configure(torch.get_num_threads())
        assert (subnormal * 1.0).item() == 0.0
    finally:
        torch.set_flush_denormal(True)

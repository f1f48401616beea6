import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from attnmt.distributed import shard_batches

from test_train import losses

NO_DROPOUT = ["model.dropout=0.0", "model.attention_dropout=0.0", "train.validate_every=1000"]


@pytest.mark.parametrize("batches,world", [(10, 2), (11, 2), (14, 4), (7, 3)])
def test_shards_cover_every_pair_once_with_equal_counts(batches, world):
    epoch = [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(batches)]
    shards = [shard_batches(epoch, rank, world) for rank in range(world)]
    assert len({len(shard) for shard in shards}) == 1                 # no rank waits for another
    seen = sorted(i for shard in shards for batch in shard for i in batch)
    assert seen == list(range(3 * batches))


def test_shards_repeat_only_when_fewer_pairs_than_ranks_remain():
    epoch = [[0, 1], [2, 3], [4]]
    shards = [shard_batches(epoch, rank, 4) for rank in range(4)]
    assert all(len(shard) == 1 for shard in shards)
    assert {i for shard in shards for batch in shard for i in batch} == {0, 1, 2, 3, 4}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(config, run, *overrides, session=False):
    """``torchrun --nproc-per-node 2 -m attnmt train CONFIG --run-dir RUN --set ...``, as a user
    writes it (torchrun's own parser sees every option after the module name)."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-port", str(free_port()), "-m", "attnmt",
                             "train", str(config), "--run-dir", str(run),
                             *[argument for o in overrides for argument in ("--set", o)]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=session)


def single(config, run, *overrides):
    return subprocess.run([sys.executable, "-m", "attnmt", "train", str(config), "--run", str(run),
                           *[f"--set={o}" for o in overrides]], capture_output=True, text=True,
                          timeout=300)


def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(tiny_config, tmp_path):
    distributed = torchrun(tiny_config, tmp_path / "ddp", "train.max_steps=6", *NO_DROPOUT)
    _, stderr = distributed.communicate(timeout=300)
    assert distributed.returncode == 0, stderr
    alone = single(tiny_config, tmp_path / "one", "train.max_steps=6", "train.accumulate=2",
                   *NO_DROPOUT)
    assert alone.returncode == 0, alone.stderr
    ours, reference = (load_file(str(tmp_path / name / "last.safetensors")) for name in ("ddp", "one"))
    assert ours.keys() == reference.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], atol=1e-5, rtol=1e-5)
    assert losses(tmp_path / "ddp") == pytest.approx(losses(tmp_path / "one"), abs=1e-5)


def test_killed_distributed_run_resumes_exactly(tiny_config, tmp_path):
    options = ["train.max_steps=120", "train.validate_every=40"]
    reference = torchrun(tiny_config, tmp_path / "reference", *options)
    _, stderr = reference.communicate(timeout=300)
    assert reference.returncode == 0, stderr
    victim = torchrun(tiny_config, tmp_path / "killed", *options, session=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        log = tmp_path / "killed" / "log.csv"
        if log.is_file() and max(losses(tmp_path / "killed"), default=0) >= 55:
            break
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)                # torchrun and both workers
    victim.wait()
    assert max(losses(tmp_path / "killed")) < 120
    resumed = torchrun(tiny_config, tmp_path / "killed", *options)
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert losses(tmp_path / "killed") == losses(tmp_path / "reference")


def test_resuming_with_another_number_of_processes_is_refused(tiny_config, tmp_path):
    assert single(tiny_config, tmp_path / "run", "train.max_steps=2").returncode == 0
    again = torchrun(tiny_config, tmp_path / "run", "train.max_steps=4")
    _, stderr = again.communicate(timeout=300)
    assert again.returncode != 0 and "was trained by 1 process(es); resume it with the same number" in stderr

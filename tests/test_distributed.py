import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnmt.distributed import finish_worker, shard_batches

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


def test_a_worker_leaves_without_interpreter_teardown(monkeypatch):
    # PyTorch's C++ teardown at exit sometimes aborts a finished gloo rank; a worker skips it.
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert finish_worker(3) == 3 and exits == []
    monkeypatch.setenv("WORLD_SIZE", "2")
    finish_worker(3)
    assert exits == [3]


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


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun may start its workers in their own group)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def single(config, run, *overrides):
    return subprocess.run([sys.executable, "-m", "attnmt", "train", str(config), "--run", str(run),
                           *[f"--set={o}" for o in overrides]], capture_output=True, text=True,
                          timeout=300)


# Run by torchrun (2 processes) or by python (1 process): one update of the tiny config,
# recording the synchronised gradients the optimizer receives (rank 0 writes them).
GRADIENTS_SCRIPT = """
import sys
import torch
from safetensors.torch import save_file
from attnmt.config import load_config
from attnmt.distributed import barrier, finish_worker, init_cluster, shutdown
from attnmt.run import RunDirectory, prepare_data
from attnmt.train import Trainer

config_path, run_dir, out, *overrides = sys.argv[1:]
config = load_config(config_path, overrides)
cluster = init_cluster("cpu")
run = RunDirectory(run_dir)
run.path.mkdir(exist_ok=True)
trainer = Trainer(config, run, prepare_data(config, run, cluster), cluster)
step = trainer.optimizer.step
def record_then_step(*args, **kwargs):
    if cluster.is_main:
        save_file({name: p.grad.contiguous() for name, p in trainer.model.named_parameters()}, out)
    return step(*args, **kwargs)
trainer.optimizer.step = record_then_step
stream = trainer.batch_stream()
trainer.train_step([next(stream) for _ in range(config.train.accumulate)])
barrier(cluster)                   # leave the process group together, not one by one
shutdown(cluster)
finish_worker(0)                   # no interpreter teardown, which sometimes aborts a gloo rank
"""


def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(tiny_config, tmp_path):
    # Gradients after one update: a wrong world factor or token count shows here directly,
    # where Adam and clipping would hide it in the weights.
    script = tmp_path / "gradients.py"
    script.write_text(GRADIENTS_SCRIPT)
    common = [*NO_DROPOUT, "train.clip_norm=0"]
    distributed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                  "2", "--master-port", str(free_port()), str(script), str(tiny_config),
                                  str(tmp_path / "g2"), str(tmp_path / "ddp.safetensors"), *common],
                                 capture_output=True, text=True, timeout=300)
    assert distributed.returncode == 0, distributed.stderr
    alone = subprocess.run([sys.executable, str(script), str(tiny_config), str(tmp_path / "g1"),
                            str(tmp_path / "one.safetensors"), *common, "train.accumulate=2"],
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    ours, reference = (load_file(str(tmp_path / f"{name}.safetensors")) for name in ("ddp", "one"))
    assert ours.keys() == reference.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], atol=1e-6, rtol=1e-4)

    # ... and six updates as the user runs them: the same weights and logged losses.
    distributed = torchrun(tiny_config, tmp_path / "ddp", "train.max_steps=6", *NO_DROPOUT)
    _, stderr = distributed.communicate(timeout=300)
    assert distributed.returncode == 0, stderr
    alone = single(tiny_config, tmp_path / "one", "train.max_steps=6", "train.accumulate=2",
                   *NO_DROPOUT)
    assert alone.returncode == 0, alone.stderr
    ours, reference = (load_file(str(tmp_path / name / "last.safetensors")) for name in ("ddp", "one"))
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], atol=1e-5, rtol=1e-5)
    ddp_losses, one_losses = losses(tmp_path / "ddp"), losses(tmp_path / "one")
    assert ddp_losses.keys() == one_losses.keys()
    for step in ddp_losses:
        assert float(ddp_losses[step]) == pytest.approx(float(one_losses[step]), abs=1e-5)


# Run by torchrun: a time-budgeted run whose ranks' clocks disagree (rank r's step takes
# r + 1 seconds). Every rank must follow one clock (the learning rate depends on it), so the
# replicas end equal; rank 0 prints the steps and whether they are.
REPLICAS_SCRIPT = """
import itertools
import sys
import torch
from attnmt.config import load_config
from attnmt.distributed import barrier, finish_worker, gather_objects, init_cluster, shutdown
from attnmt.run import RunDirectory, prepare_data
from attnmt.train import Trainer

config_path, run_dir, *overrides = sys.argv[1:]
config = load_config(config_path, overrides)
cluster = init_cluster("cpu")
run = RunDirectory(run_dir)
run.path.mkdir(exist_ok=True)
ticks = itertools.count()
clock = lambda: next(ticks) * (cluster.rank + 1)     # read at start and end of a step: r + 1 s
trainer = Trainer(config, run, prepare_data(config, run, cluster), cluster, clock=clock)
progress = trainer.fit()
weights = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
replicas = gather_objects((progress.step, weights), cluster)
if cluster.is_main:
    print("steps", [step for step, _ in replicas], "equal", torch.equal(replicas[0][1], replicas[1][1]))
barrier(cluster)
shutdown(cluster)
finish_worker(0)
"""


def test_replicas_follow_one_clock_under_a_time_budget(tiny_config, tmp_path):
    script = tmp_path / "replicas.py"
    script.write_text(REPLICAS_SCRIPT)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), str(script), str(tiny_config),
                          str(tmp_path / "run"), *NO_DROPOUT, "train.max_steps=0",
                          "train.max_minutes=0.1", "train.schedule=linear", "train.warmup=2"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "steps [6, 6] equal True" in run.stdout      # 6 s of rank 0's time, one second a step


def test_attnmt_starts_the_processes_itself(tiny_config, tmp_path):
    # `attnmt train ... --nproc-per-node 2` runs what torchrun runs: the same weights.
    options = ["train.max_steps=4", *NO_DROPOUT]
    launched = subprocess.run([sys.executable, "-m", "attnmt", "train", str(tiny_config),
                               "--run-dir", str(tmp_path / "ours"), "--nproc-per-node", "2",
                               *[argument for o in options for argument in ("--set", o)]],
                              capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr
    assert f"run directory: {tmp_path / 'ours'}" in launched.stdout
    reference = torchrun(tiny_config, tmp_path / "torchrun", *options)
    _, stderr = reference.communicate(timeout=300)
    assert reference.returncode == 0, stderr
    ours, theirs = (load_file(str(tmp_path / name / "last.safetensors")) for name in ("ours", "torchrun"))
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert "trained by 2 process" not in launched.stderr
    broken = subprocess.run([sys.executable, "-m", "attnmt", "train", str(tiny_config), "--run-dir",
                             str(tmp_path / "bad"), "--nproc-per-node", "2", "--set", "model.heads=3"],
                            capture_output=True, text=True, timeout=300)
    assert broken.returncode == 1
    assert "attnmt: error: model.heads (3) must divide model.d_model (32)" in broken.stderr


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
    for pid in [victim.pid, *descendants(victim.pid)]:   # torchrun and both workers
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    victim.wait()
    assert max(losses(tmp_path / "killed")) < 80, "the run passed its second checkpoint"
    assert (tmp_path / "killed" / "checkpoints" / "step_40.safetensors").is_file()
    resumed = torchrun(tiny_config, tmp_path / "killed", *options)
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert f"resuming {tmp_path / 'killed'} at step 40" in stderr
    assert losses(tmp_path / "killed") == losses(tmp_path / "reference")
    ours, theirs = (load_file(str(tmp_path / name / "last.safetensors")) for name in ("killed", "reference"))
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


def test_resuming_with_another_number_of_processes_is_refused(tiny_config, tmp_path):
    assert single(tiny_config, tmp_path / "run", "train.max_steps=2").returncode == 0
    again = torchrun(tiny_config, tmp_path / "run", "train.max_steps=4")
    _, stderr = again.communicate(timeout=300)
    assert again.returncode != 0 and "was trained by 1 process(es); resume it with the same number" in stderr

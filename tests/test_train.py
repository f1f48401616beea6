import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from attnmt.checkpoint import load_weights, save_weights
from attnmt.config import load_config, save_config
from attnmt.data import UNK_ID
from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError
from attnmt.run import RunDirectory, prepare_data
from attnmt.train import Trainer, train
from attnmt.transformer import FeedForward




def read_log(run: Path) -> list[dict]:
    return RunDirectory(run).read_log()


def losses(run: Path) -> dict[int, str]:
    return {int(row["step"]): row["loss"] for row in read_log(run) if row["loss"]}


def attnmt(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "attnmt", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


class FakeClock:
    """Every call is a quarter second after the previous one: each update takes 0.25 s."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


def trainer_for(config, run_dir: Path, clock=time.perf_counter) -> Trainer:
    run = RunDirectory(run_dir)
    run.path.mkdir()
    return Trainer(config, run, prepare_data(config, run), clock=clock)


def test_time_budget_ends_the_schedule_exactly_when_the_budget_ends(tiny_config, tmp_path):
    # 0.25 minutes = 15 s = 60 updates of 0.25 s; validation time (also 0.25 s) is not counted.
    config = load_config(tiny_config, ["train.max_steps=0", "train.max_minutes=0.25",
                                       "train.schedule=linear", "train.validate_every=25"])
    trainer_for(config, tmp_path / "run", FakeClock()).fit()
    log = read_log(tmp_path / "run")
    assert int(log[-1]["step"]) == 60
    assert [float(row["progress"]) for row in log[:3]] == pytest.approx([1 / 60, 2 / 60, 3 / 60], abs=1e-4)
    assert float(log[-1]["progress"]) == 1.0
    assert float(log[-1]["train_s"]) == 15.0                  # 3 validations of 0.25 s on top:
    assert float(log[-1]["elapsed_s"]) == pytest.approx(15.75, abs=0.06)
    for row in log:                  # the rate of update n uses the progress before it
        step = int(row["step"])
        expected = 0.003 * min(1.0, step / 20) * (1 - (step - 1) / 60)
        assert float(row["lr"]) == pytest.approx(expected, rel=1e-5)


def test_an_epoch_budget_ends_the_schedule_with_the_last_pass(tiny_config, tmp_path):
    config = load_config(tiny_config, ["train.max_steps=0", "train.max_epochs=2",
                                       "train.schedule=linear", "train.validate_every=1000"])
    trainer = trainer_for(config, tmp_path / "run")
    progress = trainer.fit()
    per_pass = trainer.epoch_batches                  # the same in both passes: no sampling
    log = read_log(tmp_path / "run")
    assert progress.step == 2 * per_pass and progress.epoch == 2       # no batch of a third pass
    assert [int(row["epoch"]) for row in log].count(0) == per_pass - 1  # a pass counts at its end
    assert [float(row["progress"]) for row in log] == pytest.approx(
        [step / (2 * per_pass) for step in range(1, 2 * per_pass + 1)], abs=1e-4)
    for row in log:                  # as with a step budget, update n counts itself
        step = int(row["step"])
        expected = 0.003 * min(1.0, step / 20) * (1 - step / (2 * per_pass))
        assert float(row["lr"]) == pytest.approx(expected, rel=1e-5, abs=1e-12)
    assert float(log[-1]["lr"]) == 0.0


def test_a_state_saved_at_a_pass_end_by_earlier_versions_goes_on_with_the_next_pass(tiny_config, tmp_path):
    trainer = trainer_for(load_config(tiny_config, []), tmp_path / "run")
    next(trainer.batch_stream())
    trainer.progress.batch_in_epoch = trainer.epoch_batches     # they counted the pass one batch late
    resumed = next(trainer.batch_stream())
    assert (trainer.progress.epoch, trainer.progress.batch_in_epoch) == (1, 1)
    fresh = trainer_for(load_config(tiny_config, []), tmp_path / "fresh")
    fresh.progress.epoch = 1
    first_of_second_pass = next(fresh.batch_stream())
    assert torch.equal(resumed.src, first_of_second_pass.src)


def test_same_seed_same_first_50_losses(tiny_config, tmp_path):
    runs = []
    for name in ("a", "b"):
        config = load_config(tiny_config, ["train.max_steps=50", "train.validate_every=1000"])
        trainer_for(config, tmp_path / name).fit()
        runs.append(losses(tmp_path / name))
    assert len(runs[0]) == 50 and runs[0] == runs[1]


def test_short_training_on_numbers_learns(tiny_config, tmp_path):
    run = RunDirectory(train(tiny_config, tmp_path / "run", ["train.max_steps=150"]))
    log = read_log(run.path)
    assert float(log[-1]["valid_loss"]) < 1.0 < float(log[0]["loss"])
    for name in ("config.yaml", "tokenizer.json", "best.safetensors", "last.safetensors",
                 "trainer_state.pt"):
        assert (run.path / name).is_file(), name


def kill_after_step(run: Path, step: int, options: list[str]) -> dict[int, str]:
    """Start training, SIGKILL it once it has logged ``step``; the losses it had logged."""
    victim = attnmt("train", *options)
    deadline = time.time() + 240
    while time.time() < deadline:
        if (run / "log.csv").is_file() and max(losses(run), default=0) >= step:
            break
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    return losses(run)


@pytest.mark.parametrize("settings", [[], ["train.schedule=wsd", "train.cooldown=0.5",
                                           "train.ema_decay=0.95", "train.pad_multiple=8",
                                           "train.source_word_dropout=0.2", "train.rdrop=1",
                                           "train.rdrop_from=0.2", "train.optimizer=adamw",
                                           "train.weight_decay=0.1", "train.weight_decay_on=matrices",
                                           "model.ffn_dropout=0.3", "train.ffn_dropout_from_epoch=5"]],
                         ids=["noam", "wsd-ema-pad8-worddrop-rdrop-adamw-lateffndrop"])
def test_resume_after_sigkill_is_exact(tiny_config, tmp_path, settings):
    assert_resume_after_sigkill_is_exact(tiny_config, tmp_path, settings)


def synthetic_numbers(tmp_path: Path) -> str:
    """A synthetic corpus for the tiny config: 300 number pairs other than its training ones
    (seed 7); returns its prefix."""
    corpus = numbers_corpus("train", "de", "en", 999, {"train": 300, "valid": 0, "test": 0}, 7)
    for lang, lines in (("de", corpus.source), ("en", corpus.target)):
        (tmp_path / f"synthetic.{lang}").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "synthetic")


@pytest.mark.parametrize("until", [0.2, 0.3], ids=["ended-before-the-checkpoint", "ending-after-it"])
def test_resume_around_the_end_of_the_synthetic_pairs_is_exact(tiny_config, tmp_path, until):
    """The synthetic pairs end at step 40 (0.2 of 200: the resumed run starts on the real pairs
    alone) or 60 (0.3: it ends them again); the run resumes from step 50, killed after 70."""
    assert_resume_after_sigkill_is_exact(tiny_config, tmp_path, [
        f"data.synthetic=[{synthetic_numbers(tmp_path)}]", f"data.synthetic_until={until}"])


def assert_resume_after_sigkill_is_exact(tiny_config, tmp_path, settings):
    options = [argument for setting in settings for argument in ("--set", setting)]
    reference = attnmt("train", str(tiny_config), "--run", str(tmp_path / "reference"), *options)
    assert reference.wait(timeout=300) == 0, reference.stderr.read()

    killed_run = tmp_path / "killed"
    before_kill = kill_after_step(killed_run, 70, [str(tiny_config), "--run", str(killed_run), *options])
    assert max(before_kill) < 100, "training passed its second checkpoint before the kill"
    assert (killed_run / "checkpoints" / "step_50.safetensors").is_file()

    resumed = attnmt("train", str(tiny_config), "--run", str(killed_run), *options)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert f"resuming {killed_run} at step 50" in resumed.stderr.read()
    assert losses(killed_run) == losses(tmp_path / "reference")
    assert len(losses(killed_run)) == 200
    for name in ("last", "best"):
        ours, reference = (load_file(str(run / f"{name}.safetensors"))
                           for run in (killed_run, tmp_path / "reference"))
        assert ours.keys() == reference.keys()
        assert all(torch.equal(ours[key], reference[key]) for key in ours), name
    columns = ["step", "progress", "lr", "valid_bleu", "ema_valid_bleu"]
    assert [[row[c] for c in columns] for row in read_log(killed_run)] == \
        [[row[c] for c in columns] for row in read_log(tmp_path / "reference")]


def test_synthetic_pairs_end_at_synthetic_until_then_each_real_pair_trains_once_a_pass(tiny_config,
                                                                                       tmp_path):
    config = load_config(tiny_config, [f"data.synthetic=[{synthetic_numbers(tmp_path)}]",
                                       "data.synthetic_until=0.3", "train.max_steps=80"])
    trainer = trainer_for(config, tmp_path / "run")
    tag = trainer.data.source_tokenizer.processor.piece_to_id("<bt>")
    stream, before, after = trainer.batch_stream(), [], []
    for step in range(24 + len(trainer.data.real) // 3):
        batch = next(stream)
        (before if step < 24 else after).append(batch)
        trainer.progress.step += 1          # 24 of 80 steps end them, in the second pass (20 a pass)
    assert any((batch.src == tag).any() for batch in before)
    assert not any((batch.src == tag).any() for batch in after)
    first_real_pass = trainer.progress.real_only_from_epoch
    assert first_real_pass == 2 and trainer.progress.epoch > first_real_pass   # the rest of pass 1 left out
    real_pass = [index for batch in after for index in batch.indices][:len(trainer.data.real)]
    assert sorted(real_pass) == list(range(len(trainer.data.real)))   # each real pair once
    assert len(trainer.data.real) == 600 and len(trainer.data.train) == 900

    trainer.save_checkpoint(None)
    save_config(config, trainer.run.config)
    with pytest.raises(UserError, match=r"data.synthetic_until \(0.3 saved, 1.0 now\)"):
        train(tiny_config, trainer.run.path, [f"data.synthetic=[{synthetic_numbers(tmp_path)}]"])


@pytest.mark.parametrize("weight_decay_on", ["all", "matrices"])
def test_weight_decay_on_matrices_spares_biases_and_norms(tiny_config, tmp_path, weight_decay_on):
    config = load_config(tiny_config, ["train.optimizer=adamw", "train.weight_decay=0.5",
                                       f"train.weight_decay_on={weight_decay_on}"])
    trainer = trainer_for(config, tmp_path / "run")
    named = dict(trainer.model.named_parameters())
    before = {name: weight.detach().clone() for name, weight in named.items()}
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.1
    for weight in named.values():     # zero gradients: AdamW's step is its decay alone
        weight.grad = torch.zeros_like(weight)
    trainer.optimizer.step()
    spared = {name for name, weight in named.items()
              if weight_decay_on == "matrices" and weight.dim() == 1}
    if weight_decay_on == "matrices":
        assert any("bias" in name for name in spared) and any("norm" in name for name in spared)
    for name, weight in named.items():
        factor = 1.0 if name in spared else 1 - 0.1 * 0.5
        torch.testing.assert_close(weight.detach(), before[name] * factor, msg=name)


def test_resume_takes_the_optimizer_settings_of_the_config(tiny_config, tmp_path):
    """The saved state brings the moments; weight decay and the optimizer are the config's.
    A refused resume leaves the run's config.yaml as it was; an accepted one saves its own."""
    run = RunDirectory(train(tiny_config, tmp_path / "run", ["train.max_steps=2", "train.validate_every=1"]))
    config = load_config(tiny_config, ["train.optimizer=adamw", "train.weight_decay=0.3"])
    resumed = Trainer(config, run, prepare_data(config, run))
    resumed.resume()
    assert [group["weight_decay"] for group in resumed.optimizer.param_groups] == [0.3]
    assert resumed.optimizer.param_groups[0]["decoupled_weight_decay"]
    assert resumed.optimizer.state, "the saved moments were not loaded"

    saved_config = run.config.read_text()
    with pytest.raises(UserError, match="optimizer state of 1 parameter group.*"
                                        "weight_decay_on: matrices makes 2"):
        train(tiny_config, run.path, ["train.max_steps=4", "train.weight_decay_on=matrices"])
    assert run.config.read_text() == saved_config
    train(tiny_config, run.path, ["train.max_steps=3"])      # an accepted resume saves its config
    assert load_config(run.config).train.max_steps == 3


def test_resume_with_subword_sampling_redoes_the_same_steps(tiny_config, tmp_path):
    # SentencePiece's sampler differs between processes, so there is no reference run: the
    # steps after the checkpoint, done before the kill, must come out the same when redone.
    run = tmp_path / "run"
    options = [str(tiny_config), "--run", str(run), "--set", "data.subword_sampling=0.5",
               "--set", "train.max_steps=100"]
    before_kill = kill_after_step(run, 80, options)
    assert 80 <= max(before_kill) < 100
    assert list((run / "subwords").glob("epoch_*.npz")), "no saved segmentation to resume from"
    resumed = attnmt("train", *options)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    after = losses(run)
    assert len(after) == 100
    assert {step: after[step] for step in before_kill} == before_kill


def test_interrupted_checkpoint_write_keeps_previous(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "last.safetensors"
    save_weights(model, path)
    before = model.weight.detach().clone()

    def crash(module, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr("attnmt.checkpoint.save_model", crash)
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        save_weights(model, path)
    fresh = torch.nn.Linear(3, 2)
    load_weights(fresh, path)
    torch.testing.assert_close(fresh.weight, before)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "foreign"])
def test_bad_checkpoint_gives_one_clear_error(tmp_path, damage):
    path = tmp_path / "best.safetensors"
    save_weights(torch.nn.Linear(3, 2), path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-10])
    elif damage == "garbage":
        path.write_bytes(b"this is not a checkpoint at all")
    else:
        save_weights(torch.nn.Linear(5, 2), path)
    with pytest.raises(UserError, match=f"{path} is not a valid checkpoint for this model"):
        load_weights(torch.nn.Linear(3, 2), path)


def test_cli_reports_config_errors_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  dmodel: 128\n")
    process = attnmt("train", str(path), "--run", str(tmp_path / "run"))
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert stderr.strip().splitlines() == [
        "attnmt: error: unknown config key 'model.dmodel'; allowed keys in 'model': "
        + stderr.split("allowed keys in 'model': ")[1].strip()]
    assert "Traceback" not in stderr


def test_resuming_with_a_different_model_is_refused(tiny_config, tmp_path):
    process = attnmt("train", str(tiny_config), "--run", str(tmp_path / "run"),
                     "--set", "train.max_steps=1")
    assert process.wait(timeout=120) == 0
    process = attnmt("train", str(tiny_config), "--run", str(tmp_path / "run"),
                     "--set", "model.d_model=64")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1 and "different 'model' section: model.d_model (" in stderr
    assert "64 now" in stderr and "Traceback" not in stderr


def test_a_run_resumes_wherever_its_multi30k_files_lie(tmp_path):
    """data.dir says where the files are, not which data: a run started with it resumes
    through $ATTNMT_DATA (dir empty) or a moved folder; another pair is still refused."""
    from attnmt.run import open_run

    preset = Path(__file__).parents[1] / "configs" / "multi30k_de_en_transformer.yaml"
    save_config(load_config(preset, ["data.dir=/old/multi30k"]), tmp_path / "config.yaml")
    for moved in ([], ["data.dir=/new/multi30k"]):
        assert open_run(load_config(preset, moved), tmp_path).path == tmp_path
    with pytest.raises(UserError, match=r"different 'data' section: data.src_lang \('de' saved"):
        open_run(load_config(preset, ["data.dir=/new/multi30k", "data.src_lang=fr"]), tmp_path)


def test_resuming_names_the_decoding_settings_its_config_replaces(tiny_config, tmp_path):
    """A penalty chosen after training (evaluate --write-alpha) is not lost in silence
    when the run is trained further with its config."""
    from attnmt.cli import write_alpha
    from attnmt.config import load_config

    run = tmp_path / "run"
    first = attnmt("train", str(tiny_config), "--run", str(run), "--set", "train.max_steps=1")
    assert first.wait(timeout=120) == 0
    write_alpha(run, load_config(run / "config.yaml"), 1.5)
    again = attnmt("train", str(tiny_config), "--run", str(run), "--set", "train.max_steps=2")
    _, stderr = again.communicate(timeout=120)
    assert again.returncode == 0
    assert "the run's decoding settings are replaced by this config's: decode.alpha (1.5 saved, 0.6 now)" in stderr
    assert yaml.safe_load((run / "config.yaml").read_text())["decode"]["alpha"] == 0.6


@pytest.mark.parametrize("amx", [True, False])
def test_padding_follows_the_precision_model_and_cpu_unless_set(tiny_config, tmp_path, monkeypatch, amx):
    """fp32 and RNNs keep exact lengths; a bf16 Transformer pads to 8 on a CPU with AMX and
    keeps exact lengths on one without; a set multiple pads every training and validation
    batch. The CPU is taken to have AVX-512 BF16, so bf16 is allowed on any machine."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    exact = trainer_for(load_config(tiny_config), tmp_path / "exact")
    assert exact.pad_multiple == 1
    bf16 = trainer_for(load_config(tiny_config, ["train.precision=bf16"]), tmp_path / "bf16")
    assert bf16.pad_multiple == (8 if amx else 1)
    rnn = trainer_for(load_config(tiny_config, ["train.precision=bf16", "model.arch=rnn"]),
                      tmp_path / "rnn")
    assert rnn.pad_multiple == 1
    padded = trainer_for(load_config(tiny_config, ["train.pad_multiple=8"]), tmp_path / "padded")
    stream = padded.batch_stream()
    for batch in (next(stream) for _ in range(20)):
        assert batch.src.size(1) % 8 == 0 and batch.tgt_out.size(1) % 8 == 0
    torch.testing.assert_close(padded.validation_loss(), exact.validation_loss())


def test_resume_keeps_the_padding_chosen_at_the_start(tiny_config, tmp_path, monkeypatch):
    """A bf16 run started on a CPU with AMX (padded) and resumed on one without keeps its
    batches; an explicit multiple on resume wins. Both CPUs are taken to have AVX-512 BF16."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    config = load_config(tiny_config, ["train.precision=bf16", "train.max_steps=2",
                                       "train.validate_every=1"])
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    trainer_for(config, tmp_path / "run").fit()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    for settings, expected in [([], 8), (["train.pad_multiple=4"], 4)]:
        config = load_config(tiny_config, ["train.precision=bf16", *settings])
        run = RunDirectory(tmp_path / "run")
        resumed = Trainer(config, run, prepare_data(config, run))
        resumed.resume()
        assert resumed.pad_multiple == expected


def test_validation_builds_no_autograd_graph(tiny_config, tmp_path):
    trainer = trainer_for(load_config(tiny_config), tmp_path / "run")
    grad_enabled = []
    for module in trainer.model.modules():
        module.register_forward_hook(lambda *_: grad_enabled.append(torch.is_grad_enabled()))
    trainer.validation_loss()
    assert grad_enabled and not any(grad_enabled)


def test_source_word_dropout_blanks_training_sources_only(tiny_config, tmp_path, monkeypatch):
    trainer = trainer_for(load_config(tiny_config, ["train.source_word_dropout=0.5"]), tmp_path / "run")
    sources, encode = [], trainer.model.encode
    monkeypatch.setattr(trainer.model, "encode",
                        lambda src, mask: sources.append(src.clone()) or encode(src, mask))
    batch = next(trainer.batch_stream())
    trainer.train_step([batch])
    (trained,) = sources
    blanked = trained != batch.src
    assert (trained[blanked] == UNK_ID).all()
    assert 0.35 < blanked.sum() / (batch.src > UNK_ID).sum() < 0.65
    sources.clear()
    trainer.validation_loss()
    assert sources and not any((src == UNK_ID).any() for src in sources)


def rdrop_recorder(config, run, monkeypatch):
    """A trainer for ``config`` and the list of the R-Drop weights its losses were called with."""
    trainer = trainer_for(config, run)
    weights, loss = [], trainer.loss
    monkeypatch.setattr(trainer, "loss", lambda batch, smoothing, module=None, rdrop=0.0:
                        weights.append(rdrop) or loss(batch, smoothing, module, rdrop))
    return trainer, weights


def test_rdrop_starts_with_the_first_batch_of_its_epoch(tiny_config, tmp_path, monkeypatch):
    config = load_config(tiny_config, ["train.rdrop=2", "train.rdrop_from_epoch=1", "train.max_steps=50"])
    trainer, weights = rdrop_recorder(config, tmp_path / "run", monkeypatch)
    stream = trainer.batch_stream()
    trainer.train_step([next(stream)])
    per_pass = trainer.epoch_batches
    for _ in range(per_pass + 1):
        trainer.train_step([next(stream)])
    assert weights == [0.0] * per_pass + [2.0] * 2   # pass 0 without, pass 1 with from its first batch


def test_ffn_dropout_starts_with_the_first_batch_of_its_epoch(tiny_config, tmp_path, monkeypatch):
    config = load_config(tiny_config, ["model.ffn_dropout=0.3", "train.ffn_dropout_from_epoch=1",
                                       "train.max_steps=50"])
    trainer = trainer_for(config, tmp_path / "run")
    layers = config.model.encoder_layers + config.model.decoder_layers
    assert len(trainer.ffn_dropouts) == layers
    used, forward = [], FeedForward.forward
    monkeypatch.setattr(FeedForward, "forward", lambda module, x:
                        used.append(module.hidden_dropout.p) or forward(module, x))
    stream = trainer.batch_stream()
    trainer.train_step([next(stream)])
    per_pass = trainer.epoch_batches
    for _ in range(per_pass + 1):
        trainer.train_step([next(stream)])
    assert used == [0.0] * layers * per_pass + [0.3] * layers * 2   # pass 1 from its first batch on


def test_rdrop_starts_at_its_fraction_of_the_budget_and_never_validates(tiny_config, tmp_path,
                                                                          monkeypatch):
    config = load_config(tiny_config, ["train.rdrop=2", "train.rdrop_from=0.5", "train.max_steps=10"])
    trainer, weights = rdrop_recorder(config, tmp_path / "run", monkeypatch)
    stream = trainer.batch_stream()
    for _ in range(10):
        trainer.train_step([next(stream)])
    assert weights == [0.0] * 5 + [2.0] * 5          # p = step / 10 before each update
    weights.clear()
    trainer.validation_loss()
    assert weights and not any(weights)


# --- fine-tuning and shared vocabularies ------------------------------------------------------

@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A tiny run of the tiny config, for fine-tuning runs of the same config to start from."""
    folder = tmp_path_factory.mktemp("base")
    from conftest import TINY
    (folder / "tiny.yaml").write_text(TINY)
    return train(folder / "tiny.yaml", folder / "run", ["train.max_steps=30",
                                                        "train.validate_every=30"])


def test_fine_tuning_starts_from_the_runs_weights_and_tokenizers(tiny_config, tmp_path, base_run):
    from attnmt.run import inherit, open_run

    config = inherit(load_config(tiny_config, [f"train.init_from={base_run}", "model.dropout=0.3"]))
    assert config.data.tokenizer_from == str(base_run)
    run = open_run(config, tmp_path / "tuned")
    trainer = Trainer(config, run, prepare_data(config, run))
    shared = sorted(path.name for path in base_run.glob("spm.*.model")) + ["tokenizer.json"]
    assert len(shared) == 3                                   # a source and a target model
    for name in shared:
        assert (run.path / name).read_bytes() == (base_run / name).read_bytes()
    source = RunDirectory(base_run).load_model("best")[3].state_dict()
    assert all(torch.equal(tensor, source[name]) for name, tensor in trainer.model.state_dict().items())
    logged = [row for row in read_log(base_run) if row["valid_loss"]][-1]["valid_loss"]
    assert abs(trainer.validation_loss() - float(logged)) < 1e-5
    assert trainer.progress.step == 0


@pytest.mark.parametrize("override,message", [
    ("model.d_model=64", "train.init_from: {base} has model.d_model 32, this config 64; "
                         "fine-tuning keeps the architecture"),
    ("data.src_lang=fr", "train.init_from: {base} translates de->en, this config fr->en"),
    ("data.extra_tgt_langs=[fr]", "train.init_from: the vocabulary of {base} has no tag <2en>"),
    ("train.init_checkpoint=step_7.safetensors", "train.init_from: step_7.safetensors not found"),
])
def test_a_fine_tuning_that_cannot_fit_is_one_line_and_no_run(tiny_config, tmp_path, base_run,
                                                              override, message):
    run = tmp_path / "tuned"
    result = attnmt("train", str(tiny_config), "--run", str(run), "--init-from", str(base_run),
                    "--set", override)
    assert result.wait(timeout=120) == 1
    error = result.stderr.read()
    assert error.startswith("attnmt: error: " + message.format(base=base_run)), error
    assert error.count("\n") == 1 and not run.exists()


def test_a_fine_tuning_run_resumes_exactly(tiny_config, tmp_path, base_run):
    assert_resume_after_sigkill_is_exact(tiny_config, tmp_path, [f"train.init_from={base_run}"])


def test_runs_sharing_a_vocabulary_ensemble(tiny_config, tmp_path, base_run):
    from attnmt.translator import Translator

    other = train(tiny_config, tmp_path / "other", ["train.max_steps=20", "train.validate_every=20",
                                                    "train.seed=7", f"data.tokenizer_from={base_run}"])
    assert (other / "spm.source.model").read_bytes() == (base_run / "spm.source.model").read_bytes()
    ensemble = Translator.from_runs([base_run, other])
    assert len(ensemble.translate(["sieben"])) == 1
    alone = train(tiny_config, tmp_path / "alone", ["train.max_steps=20", "train.validate_every=20",
                                                    "data.vocab_size=60"])
    with pytest.raises(UserError, match="cannot ensemble"):
        Translator.from_runs([base_run, alone])


def test_a_fine_tuning_run_continues_without_its_source(tiny_config, tmp_path, base_run):
    import shutil

    source = tmp_path / "source"
    shutil.copytree(base_run, source)
    settings = [f"train.init_from={source}", "train.validate_every=20"]
    run = train(tiny_config, tmp_path / "tuned", settings + ["train.max_steps=20"])
    shutil.rmtree(source)
    train(tiny_config, run, settings + ["train.max_steps=40"])
    assert int(read_log(run)[-1]["step"]) == 40
    assert load_config(run / "config.yaml").data.tokenizer_from == str(source)

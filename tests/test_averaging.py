import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from attnmt.averaging import ExponentialMovingAverage, average_runs
from attnmt.errors import UserError
from attnmt.run import RunDirectory
from attnmt.translator import Translator
from conftest import TINY


def test_moving_average_equals_a_hand_computation():
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
    average = ExponentialMovingAverage(model, decay=0.5)
    shadow = torch.tensor([[1.0, -2.0]])
    for step, new in enumerate(([[3.0, 0.0]], [[0.0, 4.0]], [[2.0, 2.0]]), start=1):
        with torch.no_grad():
            model.weight.copy_(torch.tensor(new))
        average.update(model, step)
        d = min(0.5, (1 + step) / (10 + step))          # 2/11, 3/12, 4/13: the ramp, below 0.5
        shadow = d * shadow + (1 - d) * torch.tensor(new)
    assert average.factor(1) == pytest.approx(2 / 11) and average.factor(3) == pytest.approx(4 / 13)
    assert average.factor(100) == 0.5
    torch.testing.assert_close(average.state_dict()["weight"], shadow)


def test_applied_average_is_restored_and_tied_weights_count_once():
    model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5))
    model[1].weight = model[0].weight                   # tied, as the output projection
    average = ExponentialMovingAverage(model, decay=0.9)
    assert sorted(average.state_dict()) == ["0.weight", "1.bias"]
    own = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    average.update(model, 1)
    moved = [p.detach().clone() for p in model.parameters()]
    with average.applied(model):
        for parameter, before, after in zip(model.parameters(), own, moved):
            torch.testing.assert_close(parameter, before + (after - before) * (1 - 2 / 11))
    for parameter, after in zip(model.parameters(), moved):
        assert torch.equal(parameter, after)


def test_loading_another_models_average_is_refused():
    average = ExponentialMovingAverage(nn.Linear(2, 2), decay=0.9)
    with pytest.raises(ValueError, match="belongs to another model"):
        average.load_state_dict({"other.weight": torch.zeros(2, 2)})


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny runs of one model and vocabulary (the second reads the first's tokenizers)."""
    from attnmt.train import train

    folder = tmp_path_factory.mktemp("two_runs")
    (folder / "tiny.yaml").write_text(TINY)
    steps = ["train.max_steps=20", "train.validate_every=20"]
    first = train(folder / "tiny.yaml", folder / "first", steps)
    second = train(folder / "tiny.yaml", folder / "second",
                   steps + ["train.seed=7", f"data.tokenizer_from={first}", "model.dropout=0.3",
                            "model.ffn_dropout=0.2", "train.ffn_dropout_from_epoch=1"])
    return folder, first, second


def attnmt(*args):
    return subprocess.run([sys.executable, "-m", "attnmt", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_the_average_of_runs_holds_the_mean_of_their_weights_and_translates(two_runs):
    folder, first, second = two_runs
    out = average_runs([first, second], folder / "soup")
    expected = {name: (tensor + load_file(RunDirectory(second).weights())[name]) / 2
                for name, tensor in load_file(RunDirectory(first).weights()).items()}
    averaged = load_file(out / "best.safetensors")
    assert sorted(averaged) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(averaged[name], tensor, rtol=0, atol=1e-7)
    assert json.loads(RunDirectory(out).average.read_text())["runs"] == [str(first.absolute()),
                                                                      str(second.absolute())]
    assert Translator.from_run(out).translate(["sieben"], beam=2)[0].best.text


def test_an_average_continues_only_as_the_start_of_another_run(two_runs):
    from attnmt.train import train

    folder, first, second = two_runs
    out = average_runs([first, second], folder / "start")
    with pytest.raises(UserError, match=r"holds an average of runs .* train.init_from="):
        train(folder / "tiny.yaml", out, ["train.max_steps=2"])
    assert json.loads(RunDirectory(out).average.read_text())     # untouched
    child = train(folder / "tiny.yaml", folder / "child",
                  ["train.max_steps=2", "train.validate_every=2", f"train.init_from={out}"])
    assert (child / "best.safetensors").is_file()


def test_the_command_refuses_to_destroy_what_it_did_not_write(two_runs):
    folder, first, second = two_runs
    made = attnmt("average", first, second, "-o", folder / "cli")
    assert made.returncode == 0 and "averaged 2 runs" in made.stdout, made.stderr
    again = attnmt("average", first, second, "-o", folder / "cli")
    assert again.returncode == 1 and "holds an earlier average" in again.stderr
    assert "Traceback" not in again.stderr
    assert attnmt("average", first, second, "-o", folder / "cli", "--force").returncode == 0
    before = load_file(RunDirectory(first).weights())
    into_run = attnmt("average", first, second, "-o", first)
    assert into_run.returncode == 1 and "would destroy it" in into_run.stderr
    other = attnmt("average", first, second, "-o", second.parent)
    assert other.returncode == 1 and "holds the run" in other.stderr
    assert all(torch.equal(before[name], tensor)
               for name, tensor in load_file(RunDirectory(first).weights()).items())


def test_runs_that_cannot_be_averaged_are_named(two_runs, tiny_runs, char_run, french_run,
                                                tmp_path):
    folder, first, second = two_runs
    cases = [([first], "at least two runs"),
             ([first, tmp_path], "is not an attnmt run directory"),
             ([first, french_run], r"cannot average .*\(de->en\) with .*\(fr->en\)"),
             ([first, char_run], "their source vocabularies differ"),
             ([first, tiny_runs["transformer"]], r"their models differ \(model.max_positions"),
             ([tiny_runs["transformer"], tiny_runs["rnn"]], r"their models differ \(model.arch")]
    for runs, message in cases:
        with pytest.raises(UserError, match=message):
            average_runs(runs, tmp_path / "out")
    with pytest.raises(UserError, match="was not written by 'attnmt average'"):
        average_runs([first, second], tiny_runs["none"])
    assert not (tmp_path / "out").exists()

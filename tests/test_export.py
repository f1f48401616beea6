"""Export to CTranslate2 and the CTranslate2 engine: the same translations as PyTorch."""

import subprocess
import sys

import numpy as np
import pytest

from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError
from attnmt.export import export_run
from attnmt.train import train
from attnmt.translator import SearchOptions, Translator

from conftest import TINY

ctranslate2 = pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed "
                                                        "(pip install -e \".[ct2]\")")

# 250 German number words from the range the tiny models learned (0..999).
SOURCES = numbers_corpus("test", "de", "en", 999, {"train": 0, "valid": 0, "test": 250},
                         seed=5).source

VARIANTS = {"post-sinusoidal": [],
            "pre-learned": ["model.norm=pre", "model.positions=learned"]}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def exported(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    (folder / "tiny.yaml").write_text(TINY)
    run = train(folder / "tiny.yaml", folder / "run", ["train.max_steps=150", "train.validate_every=150",
                                                       *VARIANTS[request.param]])
    export_run(run, folder / "float32", "float32")
    return (Translator.from_run(run),
            Translator.from_run(folder / "float32", engine="ctranslate2", quantization="float32"))


def test_greedy_tokens_are_the_same_on_every_sentence(exported):
    torch_engine, c_engine = exported
    ours = torch_engine.translate(SOURCES, beam=1)
    theirs = c_engine.translate(SOURCES, beam=1)
    assert len(SOURCES) >= 200
    assert [t.best.ids for t in theirs] == [t.best.ids for t in ours]
    assert [t.best.log_prob for t in theirs] == pytest.approx([t.best.log_prob for t in ours], abs=1e-3)


def test_beam_best_hypothesis_agrees_on_95_percent(exported):
    torch_engine, c_engine = exported
    ours = torch_engine.translate(SOURCES, beam=5)
    theirs = c_engine.translate(SOURCES, beam=5)
    same = sum(a.best.ids == b.best.ids for a, b in zip(ours, theirs))
    assert same >= 0.95 * len(SOURCES), f"{same} of {len(SOURCES)}"


def test_n_best_empty_input_and_attention(exported):
    torch_engine, c_engine = exported
    (empty, full) = c_engine.translate(["", "dreihundertzwölf"], beam=4, n_best=3, need_attention=True)
    assert [h.text for h in empty.hypotheses] == [""]
    assert len(full.hypotheses) == 3
    attention = full.best.attention                    # (T + 1, 1, 1, S + 1): last layer, heads averaged
    assert attention.shape == (len(full.best.ids) + 1, 1, 1, len(full.source_tokens) + 1)
    assert attention[:-1].sum(-1).flatten().tolist() == pytest.approx([1.0] * len(full.best.ids), abs=1e-4)
    reference = torch_engine.translate(["dreihundertzwölf"], beam=1, need_attention=True)[0].best
    if reference.ids == c_engine.translate(["dreihundertzwölf"], beam=1)[0].best.ids:
        ours = c_engine.translate(["dreihundertzwölf"], beam=1, need_attention=True)[0].best.attention
        expected = reference.attention[:-1, -1].mean(axis=1)         # last layer, heads averaged
        np.testing.assert_allclose(ours[:-1, 0, 0], expected, atol=1e-4, rtol=1e-4)


def test_whitespace_and_control_characters_give_what_plain_text_gives(exported):
    for translator in exported:
        found = translator.translate(["   \t ", "\x00\x01", "\x00sieben\x1b", "sieben"], beam=3)
        assert [t.best.text for t in found[:2]] == ["", ""]
        assert found[2].best.ids == found[3].best.ids and found[2].source_tokens == found[3].source_tokens


def test_prefix_is_honoured_by_both_engines(exported):
    torch_engine, c_engine = exported
    prefix = torch_engine.target_tokenizer.encode("three hundred")
    for beam in (1, 4):
        ours = torch_engine.translate(SOURCES[:60], beam=beam, prefix="three hundred")
        theirs = c_engine.translate(SOURCES[:60], beam=beam, prefix="three hundred")
        assert all(t.best.ids[:len(prefix)] == prefix for t in ours + theirs)
        if beam == 1:                                      # the same greedy continuation
            assert [t.best.ids for t in theirs] == [t.best.ids for t in ours]
    with pytest.raises(UserError, match="does not expose the steps of its beam search"):
        c_engine.translate(["sieben"], trace=True)


def test_a_one_to_many_export_follows_the_target_language(one_to_many_run, tmp_path):
    export_run(one_to_many_run, tmp_path / "exported", "float32")
    ours, theirs = Translator.from_run(one_to_many_run), Translator.from_run(tmp_path / "exported")
    assert "CTranslate2, float32" in theirs.engine.description     # an export runs as written
    outputs = {}
    for lang in ("en", "fr"):
        expected = ours.translate(SOURCES[:80], beam=1, target_lang=lang)
        found = theirs.translate(SOURCES[:80], beam=1, target_lang=lang)
        outputs[lang] = [t.best.ids for t in found]
        assert outputs[lang] == [t.best.ids for t in expected]
        assert [t.best.log_prob for t in found] == pytest.approx([t.best.log_prob for t in expected],
                                                                abs=1e-3)
    assert sum(a == b for a, b in zip(outputs["en"], outputs["fr"])) < 0.05 * len(outputs["en"])
    with pytest.raises(UserError, match="this model translates de into en, fr only"):
        theirs.translate(["sieben"], target_lang="cs")


def test_length_limits_of_one_token_give_the_empty_output_in_a_mixed_batch(exported):
    # Limit = int(0.5 * source tokens): 1 for the short sources (only EOS fits), more for the
    # long ones; the engine is called once per limit and the answers must land in order.
    torch_engine, c_engine = exported
    sources = [torch_engine.source_tokenizer.encode(text) for text in SOURCES[:40]]
    short = [len(ids) // 2 <= 1 for ids in sources]            # max(1, int(0.5 * length)) == 1
    assert any(short) and not all(short)
    options = SearchOptions(beam=1, alpha=0.0, n_best=1, max_len_a=0.5, max_len_b=0, min_len=0,
                            need_attention=False)
    ours = torch_engine.engine.search(sources, options)
    theirs = c_engine.engine.search(sources, options)
    assert [[h.tokens for h in row] for row in theirs] == [[h.tokens for h in row] for row in ours]
    shorts = [index for index, is_short in enumerate(short) if is_short]
    assert [theirs[i][0].tokens for i in shorts] == [[]] * len(shorts)
    assert [theirs[i][0].log_prob for i in shorts] == [ours[i][0].log_prob for i in shorts] \
        == [0.0] * len(shorts)                          # the EOS forced at the limit is free


def test_rnn_runs_missing_extra_and_non_empty_folders_are_refused(tiny_runs, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="CTranslate2 runs Transformers only"):
        export_run(tiny_runs["rnn"], tmp_path / "rnn")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    for force in (False, True):        # --force replaced a folder of the user's files
        with pytest.raises(UserError, match="holds files that 'attnmt export' did not write"):
            export_run(tiny_runs["transformer"], tmp_path / "full", force=force)
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    export_run(tiny_runs["transformer"], tmp_path / "new")
    with pytest.raises(UserError, match="holds an earlier export; choose another folder or add"):
        export_run(tiny_runs["transformer"], tmp_path / "new")
    (tmp_path / "new" / "notes.txt").write_text("mine")           # a user's file added to it
    with pytest.raises(UserError, match="holds files that 'attnmt export' did not write"):
        export_run(tiny_runs["transformer"], tmp_path / "new", force=True)
    (tmp_path / "new" / "notes.txt").unlink()
    export_run(tiny_runs["transformer"], tmp_path / "new", force=True)
    assert (tmp_path / "new" / "model.bin").is_file()
    (tmp_path / ".other.tmp").mkdir()                              # not left by an export
    (tmp_path / ".other.tmp" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="was not left by 'attnmt export'"):
        export_run(tiny_runs["transformer"], tmp_path / "other")
    assert (tmp_path / ".other.tmp" / "keep.txt").read_text() == "mine"
    monkeypatch.setitem(sys.modules, "ctranslate2", None)            # as if not installed
    with pytest.raises(UserError, match=r'install the extra: pip install -e "\.\[ct2\]"'):
        export_run(tiny_runs["transformer"], tmp_path / "other")


def test_an_export_json_with_an_unknown_weight_type_is_refused_by_name(tiny_runs, tmp_path):
    export_run(tiny_runs["transformer"], tmp_path / "export", "float32")
    info = tmp_path / "export" / "export.json"
    info.write_text(info.read_text().replace('"float32"', '"int4"'))
    with pytest.raises(UserError, match=r"export\.json names the weight type 'int4', which attnmt "
                                        r"does not know"):
        Translator.from_run(tmp_path / "export")
    assert Translator.from_run(tmp_path / "export", quantization="float32").translate(["sieben"])


def test_cli_exports_once_and_translates_with_either_engine(tiny_runs, tmp_path):
    run = tiny_runs["transformer"]

    def attnmt(*args):
        return subprocess.run([sys.executable, "-m", "attnmt", *args], capture_output=True,
                              text=True, timeout=120, input="dreihundertzwölf\n")
    first = attnmt("translate", str(run), "--engine", "ctranslate2", "--quantization", "int8",
                   "--threads", "1")
    assert first.returncode == 0, first.stderr
    assert "exporting" in first.stderr and (run / "ctranslate2-int8" / "model.bin").is_file()
    again = attnmt("translate", str(run), "--engine", "ctranslate2", "--threads", "1")
    assert again.stdout == first.stdout and "exporting" not in again.stderr
    rnn = attnmt("translate", str(tiny_runs["rnn"]), "--engine", "ctranslate2")
    assert rnn.returncode == 1 and rnn.stderr.count("\n") == 1
    assert "CTranslate2 runs Transformers only" in rnn.stderr
    sampled = attnmt("translate", str(run), "--engine", "ctranslate2", "--sample")
    assert sampled.returncode == 1 and "sampling runs on the PyTorch engine only" in sampled.stderr


def test_server_on_the_ctranslate2_engine(tiny_runs):
    from fastapi.testclient import TestClient

    from attnmt.serve import create_app

    translator = Translator.from_run(tiny_runs["transformer"], engine="ctranslate2",
                                     quantization="float32")
    with TestClient(create_app(translator)) as client:
        info = client.get("/info").json()
        assert (info["engine"], info["layers"], info["heads"]) == ("ctranslate2", 1, 1)
        assert info["has_self_attention"] is False and "CTranslate2, float32" in info["model"]
        data = client.post("/translate", json={"texts": ["dreihundertzwölf", ""], "beam": 3,
                                               "n_best": 2, "attention": True}).json()
        first, empty = data["translations"]
        assert len(first["hypotheses"]) == 2 and empty["translation"] == ""
        grid = first["hypotheses"][0]["attention"]                  # [layer][head][target][source]
        assert len(grid) == 1 and len(grid[0]) == 1
        assert len(grid[0][0]) == len(first["hypotheses"][0]["tokens"]) + 1
        refused = client.post("/translate", json={"text": "sieben", "self_attention": True})
        assert refused.status_code == 422
        sampled = client.post("/translate", json={"text": "sieben", "sample": {}})
        assert sampled.status_code == 422 and "PyTorch engine only" in sampled.json()["error"]


def test_an_export_never_destroys_a_run(tiny_runs, tmp_path):
    # `attnmt export RUN RUN --force` replaced the run by the export: checkpoints, trainer
    # state and log gone. Now the run, a folder holding it, another run and a folder of
    # the run are refused in one line before anything is written, with --force too.
    import shutil

    from attnmt.cli import main

    run = tmp_path / "runs" / "tiny"
    shutil.copytree(tiny_runs["transformer"], run)
    before = sorted(str(path.relative_to(run)) for path in run.rglob("*"))
    other = tmp_path / "other_run"
    shutil.copytree(tiny_runs["rnn"], other)
    archive = tmp_path / "archive"                     # a run kept in a folder of runs
    shutil.copytree(tiny_runs["rnn"], archive / "old_run")
    for out, message in ((run, "holds the run"), (tmp_path / "runs", "holds the run"),
                         (tmp_path, "holds the run"), (other, "is a training run"),
                         (run / "checkpoints", "is a folder of the run"),
                         (archive, "did not write")):
        with pytest.raises(UserError, match=message):
            export_run(run, out, force=True)
    assert sorted(str(path.relative_to(run)) for path in run.rglob("*")) == before
    assert (other / "config.yaml").is_file() and not (other / "model.bin").exists()
    assert (archive / "old_run" / "config.yaml").is_file()
    assert main(["export", str(run), str(run), "--force"]) == 1
    assert sorted(str(path.relative_to(run)) for path in run.rglob("*")) == before
    export_run(run, run / "exported")                  # an export inside the run is fine,
    export_run(run, run / "exported", force=True)      # and replacing that export too
    assert (run / "exported" / "model.bin").is_file()


def test_the_exports_config_names_no_folder_of_the_runs_machine(tiny_runs, tmp_path):
    # An export is what moves to another machine (models/ ships them): its config.yaml kept
    # where the run found Multi30k and the runs it started from, paths of the run's machine.
    import dataclasses
    import shutil

    from attnmt.config import load_config, save_config

    run = tmp_path / "run"
    shutil.copytree(tiny_runs["transformer"], run)
    config = load_config(run / "config.yaml")
    local = dataclasses.replace(
        config, data=dataclasses.replace(config.data, dir="/home/me/data", tokenizer_from="/home/me/a"),
        train=dataclasses.replace(config.train, init_from="/home/me/b"))
    save_config(local, run / "config.yaml")
    export_run(run, tmp_path / "export")
    text = (tmp_path / "export" / "config.yaml").read_text()
    assert "/home/me" not in text
    assert load_config(tmp_path / "export" / "config.yaml") == dataclasses.replace(   # the rest kept
        local, data=dataclasses.replace(local.data, dir="", tokenizer_from=""),
        train=dataclasses.replace(local.train, init_from=""))
    assert Translator.from_run(tmp_path / "export").translate(["sieben"])


def test_a_runs_kept_export_follows_its_weights_and_checkpoint(tiny_runs, tmp_path, capsys):
    # RUN/ctranslate2-QUANTIZATION was exported once and kept: after training on, averaging,
    # or with --checkpoint last, the C++ engine went on translating the old weights.
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"            # without the exports other tests kept in the run
    shutil.copytree(tiny_runs["transformer"], run, ignore=shutil.ignore_patterns("ctranslate2-*"))
    sources = SOURCES[:40]

    def engines(checkpoint="best"):
        return [[t.best.ids for t in Translator.from_run(run, checkpoint, engine=engine,
                                                          quantization="float32")
                 .translate(sources, beam=1)] for engine in ("ctranslate2", "torch")]

    before, _ = engines()
    assert "exporting" in capsys.readouterr().err
    generator = torch.Generator().manual_seed(0)
    weights = {name: tensor + 0.3 * torch.randn(tensor.shape, generator=generator)
               for name, tensor in load_file(run / "best.safetensors").items()}
    save_file(weights, run / "best.safetensors")
    after, torch_after = engines()
    assert "again: the run's weights changed" in capsys.readouterr().err
    assert after == torch_after and after != before
    engines()
    assert "exporting" not in capsys.readouterr().err        # kept while the weights stay
    last, torch_last = engines("last")
    assert last == torch_last and last != after and "again" in capsys.readouterr().err
    (run / "best.safetensors").unlink()                       # a run copied with its export only:
    (run / "last.safetensors").unlink()                       # nothing to compare, the export used
    kept = Translator.from_run(run, engine="ctranslate2", quantization="float32")
    assert [t.best.ids for t in kept.translate(sources, beam=1)] == last
    assert "exporting" not in capsys.readouterr().err

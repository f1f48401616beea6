"""Shipped models by name, their cards and files, an export read back into PyTorch, and BLEU
in the published systems' convention."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError
from attnmt.evaluate import moses_tokenized, tokenized_lowercased_bleu
from attnmt.shipped import CARD_EXAMPLE_ENV, MODELS_ENV, Card, resolve, shipped_models

ctranslate2 = pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed "
                                                        "(pip install -e \".[ct2]\")")

ROOT = Path(__file__).resolve().parent.parent
SOURCES = numbers_corpus("test", "de", "en", 999, {"train": 0, "valid": 0, "test": 200},
                         seed=8).source


@pytest.fixture(scope="module")
def models(tiny_runs, tmp_path_factory):
    """A folder of shipped models holding one: the tiny Transformer's int8 export ``xx-yy``."""
    from attnmt.export import export_run

    folder = tmp_path_factory.mktemp("models")
    export_run(tiny_runs["transformer"], folder / "xx-yy")
    return folder


def attnmt(*args, cwd=None, env=None, stdin=""):
    return subprocess.run([sys.executable, "-m", "attnmt", *args], input=stdin, text=True,
                          capture_output=True, cwd=cwd, env={**os.environ, **(env or {})},
                          timeout=300)


def test_a_name_resolves_to_the_shipped_model_and_a_folder_of_that_name_wins(models, tiny_runs,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setenv(MODELS_ENV, str(models))
    assert resolve("xx-yy") == models / "xx-yy"
    assert resolve(str(tiny_runs["transformer"])) == tiny_runs["transformer"]
    with pytest.raises(UserError, match=r"^nope: no such run or export folder, and no shipped "
                                        r"model of that name \(shipped models: xx-yy;"):
        resolve("nope")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_runs["transformer"], tmp_path / "xx-yy")
    assert resolve("xx-yy") == Path("xx-yy")

    env = {MODELS_ENV: str(models)}
    by_name = attnmt("translate", "xx-yy", "--beam", "1", cwd=ROOT, env=env, stdin="vierzehn\n")
    by_path = attnmt("translate", str(models / "xx-yy"), "--beam", "1", stdin="vierzehn\n")
    assert by_name.returncode == 0 and by_name.stdout == by_path.stdout != ""
    local = attnmt("translate", "xx-yy", "--beam", "1", cwd=tmp_path, env=env, stdin="vierzehn\n")
    run = attnmt("translate", str(tiny_runs["transformer"]), "--beam", "1", stdin="vierzehn\n")
    assert local.stdout == run.stdout                      # the folder here: the PyTorch run
    unknown = attnmt("evaluate", "nope", "--src", "a", "--ref", "b", env=env)
    assert unknown.returncode == 1 and unknown.stderr.startswith("attnmt: error: nope: no such")


def test_attnmt_models_prints_each_cards_summary(models, tmp_path):
    folder = tmp_path / "models"
    shutil.copytree(models, folder)
    card = {"summary": "Number words, tiny.", "scores": {"test_2016_flickr": {"bleu": 12.345}}}
    (folder / "xx-yy" / "README.md").write_text(f"---\n{yaml.safe_dump(card)}---\n# xx-yy\n")
    listed = attnmt("models", env={MODELS_ENV: str(folder)})
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[0] == ("xx-yy   Number words, tiny. BLEU (cased sacreBLEU): "
                                             "test_2016_flickr 12.35")
    (folder / "xx-yy" / "README.md").write_text("no front matter")
    broken = attnmt("models", env={MODELS_ENV: str(folder)})
    assert broken.returncode == 0
    assert broken.stdout.startswith(f"xx-yy   ({folder / 'xx-yy' / 'README.md'} is not a "
                                    "readable model card")


def test_an_export_read_back_holds_each_weight_within_half_an_int8_step(tiny_runs, models):
    from attnmt.run import RunDirectory

    _, _, _, original = RunDirectory(tiny_runs["transformer"]).load_model()
    _, _, _, restored = RunDirectory(models / "xx-yy").load_model()
    restored_weights = restored.state_dict()
    for name, weight in original.state_dict().items():
        back = restored_weights[name]
        if weight.dim() == 2 and "embedder.learned" not in name:     # quantized, one scale a row
            step = weight.abs().amax(dim=1, keepdim=True) / 127
            assert ((back - weight).abs() <= step / 2 + 1e-7).all(), name
            assert (back - weight).abs().max() > 0, name            # it was quantized
        else:                                                         # stored as float32
            assert torch.equal(back, weight), name


def test_an_export_translates_on_the_pytorch_engine_as_on_its_own(tiny_runs, tmp_path):
    """Read back from a float32 export, the PyTorch engine gives the export's greedy output on
    every sentence: the reading inverts the writing exactly. (From int8 the weights differ by
    up to half a quantization step and CTranslate2 quantizes activations too; the shipped
    models' cards hold each engine's translation.)"""
    from attnmt.export import export_run
    from attnmt.translator import Translator

    folder = export_run(tiny_runs["transformer"], tmp_path / "float32", "float32")
    exported = Translator.from_run(folder, engine="ctranslate2", threads=1)
    read_back = Translator.from_run(folder, engine="torch")
    assert read_back.engine.name == "torch"
    for a, b in zip(exported.translate(SOURCES, beam=1), read_back.translate(SOURCES, beam=1)):
        assert a.best.tokens == b.best.tokens, a.source


def test_fine_tuning_starts_from_an_export_and_from_a_shipped_name(models, tiny_runs, tmp_path,
                                                                   monkeypatch):
    from safetensors.torch import load_file

    from attnmt.run import RunDirectory
    from attnmt.train import train

    from conftest import TINY

    monkeypatch.setenv(MODELS_ENV, str(models))
    (tmp_path / "tiny.yaml").write_text(TINY)
    run = train(tmp_path / "tiny.yaml", tmp_path / "tuned",
                ["train.init_from=xx-yy", "train.max_steps=1", "train.lr=0.000000000001",
                 "train.validate_every=1", "model.max_positions=40", "model.dropout=0.0"])
    _, _, _, start = RunDirectory(models / "xx-yy").load_model()
    tuned = load_file(str(RunDirectory(run).last))
    weights = start.state_dict()
    assert len(tuned) > 10
    for name, weight in tuned.items():
        assert torch.allclose(weight, weights[name], atol=1e-6), name
    assert f"init_from: {models / 'xx-yy'}" in (run / "config.yaml").read_text()


def test_a_corrupt_model_bin_is_one_line(models, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(models / "xx-yy", folder)
    data = (folder / "model.bin").read_bytes()
    (folder / "model.bin").write_bytes(data[:len(data) // 2])
    for engine in ("torch", "ctranslate2"):
        result = attnmt("translate", str(folder), "--engine", engine, stdin="vier\n")
        assert result.returncode == 1, engine
        assert result.stderr.startswith(f"attnmt: error: {folder}/model.bin is not a CTranslate2 "
                                        "model"), result.stderr
        assert "Traceback" not in result.stderr


# Lines of the public Multi30k test sets (test_2016_flickr, test_2017_flickr): the raw text,
# and the same line in the dataset's own data/task1/tok/*.lc.norm.tok.LANG files.
DATASET_LINES = [
    ("de", "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
     "ein mann mit einem orangefarbenen hut , der etwas anstarrt ."),
    ("de", "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
     "ein boston terrier läuft über saftig-grünes gras vor einem weißen zaun ."),
    ("de", "Ein Junge in einem roten Trikot versucht, die Home Base zu erreichen, während der "
           "Catcher im blauen Trikot versucht, ihn zu fangen.",
     "ein junge in einem roten trikot versucht , die home base zu erreichen , während der "
     "catcher im blauen trikot versucht , ihn zu fangen ."),
    ("de", "Ein weißer Lkw-Anhänger mit einem eingedrückten Ende und den Worten „NOTHING LEF "
           "NOTHING RIGHT“ auf der Seite, auf dem Erdboden.",
     "ein weißer lkw-anhänger mit einem eingedrückten ende und den worten &quot; nothing lef "
     "nothing right &quot; auf der seite , auf dem erdboden ."),
    ("fr", "Un terrier de Boston court sur l'herbe verdoyante devant une clôture blanche.",
     "un terrier de boston court sur l&apos; herbe verdoyante devant une clôture blanche ."),
    ("fr", "Cinq personnes avec des vestes d'hiver et des casques sont debout dans la neige, "
           "avec des motoneiges en arrière-plan.",
     "cinq personnes avec des vestes d&apos; hiver et des casques sont debout dans la neige , "
     "avec des motoneiges en arrière-plan ."),
    ("fr", "Une femme utilise une perceuse tandis qu'un autre homme la prend en photo.",
     "une femme utilise une perceuse tandis qu&apos; un autre homme la prend en photo ."),
    ("fr", "Un enfant éclabousse dans l'eau", "un enfant éclabousse dans l&apos; eau"),
    ("fr", "Un cow-boy sur le dos d'un cheval de rodéo lors d'une compétition.",
     "un cow-boy sur le dos d&apos; un cheval de rodéo lors d&apos; une compétition ."),
]


def test_moses_tokens_are_the_datasets_own():
    for lang, raw, tokenized in DATASET_LINES:
        assert moses_tokenized([raw], lang) == [tokenized]


def test_the_literatures_bleu_is_bleu_on_the_datasets_tokenised_files():
    from sacrebleu.metrics import BLEU

    for lang in ("de", "fr"):
        raw = [line for language, line, _ in DATASET_LINES if language == lang]
        dataset = [line for language, _, line in DATASET_LINES if language == lang]
        hypotheses = [" ".join(line.split()[:-2]) + "." for line in raw]      # two words short
        expected = BLEU(tokenize="none").corpus_score(moses_tokenized(hypotheses, lang), [dataset])
        assert tokenized_lowercased_bleu(hypotheses, raw, lang) == pytest.approx(expected.score)
        assert 20 < expected.score < 100


# --- the models shipped in models/ ------------------------------------------------------------

SHIPPED = sorted(path for path in (ROOT / "models").glob("*") if (path / "model.bin").is_file())


def test_six_directions_are_shipped_within_their_size_limits():
    assert [path.name for path in SHIPPED] == ["cs-en", "de-en", "en-cs", "en-de", "en-fr", "fr-en"]
    sizes = {path.name: sum(f.stat().st_size for f in path.iterdir()) for path in SHIPPED}
    assert all(size <= 10 * 2**20 for size in sizes.values()), sizes
    assert sum(sizes.values()) <= 60 * 2**20, sizes


@pytest.mark.parametrize("folder", SHIPPED, ids=[path.name for path in SHIPPED])
def test_a_shipped_model_translates_its_cards_example_on_both_engines(folder):
    from attnmt.translator import Translator

    example = Card.read(folder).fields["example"]
    exported = attnmt("translate", folder.name, "--engine", "ctranslate2", "--threads", "1",
                      env=CARD_EXAMPLE_ENV, stdin=example["source"])
    assert exported.returncode == 0 and exported.stdout.strip() == example["translation"]
    read_back = Translator.from_run(folder.name, engine="torch")
    assert read_back.translate([example["source"]])[0].best.text == example["pytorch_translation"]


@pytest.mark.parametrize("folder", SHIPPED, ids=[path.name for path in SHIPPED])
def test_a_cards_scores_are_its_records(folder):
    card = Card.read(folder)
    record = json.loads((ROOT / card.fields["record"]).read_text())
    assert card.fields["direction"] == record["direction"] == folder.name
    for test_set, scores in card.scores.items():
        for key, value in scores.items():
            assert value == record["test_sets"][test_set][key], (test_set, key)
    assert set(card.scores) == set(record["test_sets"]) - {"iwslt17_test"}
    text = (folder / "README.md").read_text()
    for scores in card.scores.values():
        assert f"| {scores['bleu']:.2f} | {scores['chrf']:.2f} | {scores['bleu_tok_lc']:.2f} |" in text
    assert "non-commercial research and education" in text


@pytest.mark.parametrize("folder", SHIPPED, ids=[path.name for path in SHIPPED])
def test_a_cards_chain_of_runs_starts_from_scratch_and_each_step_from_earlier_ones(folder):
    """The card gives every command that made the model, one numbered step per record of its
    chain: the first run trains from scratch, each later run starts from an earlier step's
    directory (or from its int8 export, the model shipped before, by name) and an average
    (a model soup) averages earlier steps' runs, as the records say; every step leads to the
    shipped one, whose directory is runs/NAME."""
    fields = Card.read(folder).fields
    records = [json.loads((ROOT / path).read_text()) for path in fields["chain"]]
    assert fields["chain"][-1] == fields["record"]
    assert all(record["direction"] == folder.name for record in records)
    steps = [line for line in (folder / "README.md").read_text().splitlines()
             if re.match(r"\d+\. `attnmt (train|average) ", line)]
    assert len(steps) == len(records)
    directories, used, exports = [], set(), {}
    for number, (step, path, record) in enumerate(zip(steps, fields["chain"], records), start=1):
        assert step.startswith(f"{number}. ") and f"(../../{path})" in step
        command = step.split("`")[1].split()
        if record["training"] is None:                          # attnmt average RUN ... -o DIR
            starts, directory = command[2:-2], command[-1]
            assert command[-2] == "-o" and starts == record["extra"]["runs"]
        else:
            directory = command[command.index("--run-dir") + 1]
            starts = [setting.split("=", 1)[1] for setting in command
                      if setting.startswith("train.init_from=")]
            assert starts == [o.split("=", 1)[1] for o in record["overrides"]
                              if o.startswith("train.init_from=")]
            for made in record.get("extra", {}).get("made_by", []):   # its synthetic pairs
                assert f"after `{made}`" in step, step
        starts = [exports.get(start, start) for start in starts]  # a shipped name: its run
        assert bool(starts) == (number > 1), step                # only the first from scratch
        assert set(starts) <= set(directories), step             # from earlier steps' runs
        used.update(starts)
        directories.append(directory)
        exported = re.search(r"`attnmt export (\S+) models/(\S+)`", step)
        if exported:                                             # the next run's start, by name
            assert exported[1] == directory and exported[2] == folder.name, step
            exports[exported[2]] = directory
    assert directories[-1] == f"runs/{folder.name}"
    assert len(set(directories)) == len(directories) and used == set(directories[:-1]), directories


def test_serve_with_no_model_serves_every_shipped_pair_to_libretranslates_client():
    from libretranslatepy import LibreTranslateAPI

    from test_serve import free_port, start_server

    port = free_port()
    server = start_server(sys.executable, [], port)
    try:
        api = LibreTranslateAPI(f"http://127.0.0.1:{port}/")
        pairs = {(language["code"], target) for language in api.languages()
                 for target in language["targets"]}
        assert pairs == {tuple(path.name.split("-")) for path in SHIPPED}
        for source, target in sorted(pairs):
            translated = api.translate(Card.read(ROOT / "models" / f"{source}-{target}")
                                       .fields["example"]["source"], source, target)
            assert isinstance(translated, str) and translated.strip()
        assert api.translate("Ein Hund rennt über die Wiese.", "auto", "en").strip()
    finally:
        server.terminate()
        server.wait(timeout=30)

"""The results files (one schema), the tables the documents generate from them, and
``benchmarks/quality.py``'s scores on every test set present."""

import argparse
import copy
import gzip
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from attnmt.errors import UserError
from conftest import TINY

ROOT = Path(__file__).resolve().parent.parent


def benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


results = benchmark("results")

RECORD = {"what": "Transformer, the preset", "direction": "de-en",
          "config": "configs/multi30k_de_en_transformer.yaml", "overrides": ["train.seed=2"],
          "parameters": 7585600, "beam": 5,
          "training": {"minutes": 60.0, "wall_minutes": 61.2, "updates": 12320, "tokens_per_s": 3107,
                       "valid_bleu_last": 43.5, "valid_bleu_best": 43.91, "valid_curve": None},
          "test_sets": {"test_2016_flickr": {"bleu": 43.02, "chrf": 62.09, "bleu_lc": 43.34,
                                             "chrf_lc": 62.33, "signature": "nrefs:1"},
                        "test_2017_mscoco": {"bleu": 30.5, "chrf": 50.0, "bleu_lc": 31.0,
                                             "chrf_lc": 51.0, "signature": "nrefs:1"}},
          "provenance": {"machine": "2-core AMD EPYC (Zen 4) with AVX-512 BF16", "precision": "bf16",
                         "threads": 2, "seed": 2, "commit": "abc1234", "date": "2026-12-03",
                         "config": None, "inferred": []}}


def test_every_results_file_follows_the_schema():
    files = sorted((ROOT / "records" / "results").glob("*.json"))
    assert len(files) > 100
    broken = {path.name: results.schema_errors(json.loads(path.read_text())) for path in files}
    assert {name: errors for name, errors in broken.items() if errors} == {}


def test_the_schema_names_what_is_wrong():
    assert results.schema_errors(RECORD) == []
    record = copy.deepcopy(RECORD)
    del record["beam"]
    record["bleu"] = 43.02                                       # a second name for one figure
    record["training"]["updates"] = "12,320"
    record["test_sets"]["test_2016_flickr"].pop("chrf")
    record["provenance"]["inferred"] = ["machine", "weather"]
    record["direction"] = "German to English"
    record["overrides"] = ["data.synthetic=[/tmp/bt/pairs]", "data.tokenizer_from=runs/de_en"]
    record["provenance"]["config"] = {"data": {"dir": "/work/shared/data/multi30k"}}
    record["extra"] = {"members_valid_bleu_beam5": {"/tmp/runs/de_en": 44.1},
                       "other_sources": {"fr": {"valid_bleu_beam5": 47.6, "bleu": 49.1}}}  # the old layout
    assert results.schema_errors(record) == [
        "beam is missing", "bleu is not a key of the schema",
        "training.updates has the wrong type (str)",
        "provenance.inferred names 'weather', not a provenance key",
        "test_sets.test_2016_flickr.chrf is missing",
        "extra.other_sources.fr.test_sets is missing", "extra.other_sources.fr.bleu is not a key of the schema",
        "direction 'German to English' is not like 'de-en' or 'de+fr+cs-en'",
        "names /tmp/bt/pairs, a path of the machine it ran on; write DATA, TED or runs/NAME",
        "names /work/shared/data/multi30k, a path of the machine it ran on; write DATA, TED or runs/NAME",
        "names /tmp/runs/de_en, a path of the machine it ran on; write DATA, TED or runs/NAME"]


def test_an_unreadable_results_file_is_named_not_a_traceback(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    assert results.file_errors(tmp_path / "broken.json")[0].startswith("not a readable JSON file")
    assert results.file_errors(tmp_path / "list.json") == ["not a JSON object"]


def test_a_broken_file_a_table_reads_is_named_before_any_table_is_rendered(tmp_path, monkeypatch):
    old_layout = copy.deepcopy(RECORD)
    old_layout.update(direction="de+fr-en", extra={"other_sources": {"fr": {"valid_bleu_beam5": 47.6,
                                                                            "bleu": 49.1}}})
    (tmp_path / "x_en.json").write_text(json.dumps(old_layout))
    document = tmp_path / "page.md"
    document.write_text("<!-- results: x_en:fr | 2016 -->\n<!-- end results -->\n")
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setattr(results, "documents", lambda: [document])
    monkeypatch.setattr(sys, "argv", ["results.py"])
    with pytest.raises(SystemExit, match="x_en.json: extra.other_sources.fr.test_sets is missing"):
        results.main()


def test_a_table_is_rendered_from_the_files(tmp_path):
    (tmp_path / "run_a.json").write_text(json.dumps(RECORD))
    assert results.render_table(["run_a"], ["what", "machine", "seed", "updates", "valid", "2016",
                                            "2017", "mscoco", "arguments"], tmp_path) == (
        "| model | machine | seed | updates | validation BLEU | test_2016_flickr | test_2017_flickr "
        "| test_2017_mscoco | config and overrides |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        "| Transformer, the preset | 2-core AMD EPYC (Zen 4) with AVX-512 BF16 | 2 | 12,320 | 43.91 "
        "| 43.02 |  | 30.50 | `configs/multi30k_de_en_transformer.yaml --set train.seed=2` |\n")
    document = ("Prose.\n\n<!-- results: run_a | what 2016 -->\n| stale |\n<!-- end results -->\n"
                "More prose.\n")
    assert results.render_document(document, tmp_path) == (
        "Prose.\n\n<!-- results: run_a | what 2016 -->\n| model | test_2016_flickr |\n| --- | --- |\n"
        "| Transformer, the preset | 43.02 |\n<!-- end results -->\nMore prose.\n")
    with pytest.raises(SystemExit, match="no column 'bleu'"):
        results.render_table(["run_a"], ["bleu"], tmp_path)
    with pytest.raises(SystemExit, match="a table names run_b"):
        results.render_table(["run_b"], ["what"], tmp_path)


def test_a_row_of_several_runs_gives_each_runs_figures_beside_opus_mt(tmp_path):
    seed_3 = copy.deepcopy(RECORD)
    seed_3.update(what="Transformer, the preset, seed 3", overrides=["train.seed=3"])
    seed_3["provenance"]["seed"] = 3
    seed_3["test_sets"] = {"test_2016_flickr": dict(RECORD["test_sets"]["test_2016_flickr"], bleu=41.5)}
    czech = copy.deepcopy(seed_3)
    czech["direction"] = "en-cs"
    for name, record in (("seed_2", RECORD), ("seed_3", seed_3), ("czech", czech)):
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    table = results.render_table(["seed_2,seed_3@¹", "czech"], ["direction", "what", "machine", "seed",
                                                               "2016_opus", "2017_opus", "mscoco_opus"],
                                 tmp_path)
    assert table.splitlines()[2:] == [
        "| de->en ¹ | Transformer, the preset | 2-core AMD EPYC (Zen 4) with AVX-512 BF16 | 2 / 3 "
        "| 43.02 / 41.50 (40.5) | – (41.5) | 30.50 (33.9) |",
        "| en->cs | Transformer, the preset, seed 3 | 2-core AMD EPYC (Zen 4) with AVX-512 BF16 | 3 "
        "| 41.50 (33.4) |  |  |"]
    assert table.splitlines()[0] == (
        "| direction | model | machine | seed | test_2016_flickr (OPUS-MT) | test_2017_flickr (OPUS-MT) "
        "| test_2017_mscoco (OPUS-MT) |")


def test_a_multilingual_models_other_pairs_come_from_its_extra_scores(tmp_path):
    one_to_many = copy.deepcopy(RECORD)
    one_to_many.update(direction="en-de+fr", what="one-to-many",
                       extra={"other_targets": {"fr": {"valid_bleu_beam5": 52.39, "test_sets": {
                           "test_2016_flickr": {"bleu": 54.58, "chrf": 71.42},
                           "test_2017_mscoco": {"bleu": 40.12, "chrf": 60.3}}}}})
    (tmp_path / "en_x.json").write_text(json.dumps(one_to_many))
    table = results.render_table(["en_x:de", "en_x:fr"], ["direction", "updates", "valid", "2016_opus",
                                                          "chrf", "mscoco_opus"], tmp_path)
    assert table.splitlines()[2:] == ["| en->de | 12,320 | 43.91 | 43.02 (36.3) | 62.09 | 30.50 (30.6) |",
                                      "| en->fr |  | 52.39 (beam 5) | 54.58 (52.4) | 71.42 | 40.12 (54.7) |"]
    with pytest.raises(SystemExit, match="en-de\\+fr has no pair scored into or from cs"):
        results.render_table(["en_x:cs"], ["direction"], tmp_path)


def test_the_documents_tables_are_those_the_files_give():
    blocks = 0
    for document in results.documents():
        text = document.read_text(encoding="utf-8")
        blocks += len(results.BLOCK.findall(text))
        assert results.render_document(text) == text, \
            f"{document.name}: a generated table is out of date; run python benchmarks/results.py"
    assert blocks > 0


def test_quality_scores_every_test_set_present_as_evaluating_it_alone(tiny_runs, tmp_path, capsys):
    from attnmt.evaluate import score_corpus
    from attnmt.translator import Translator

    quality = benchmark("quality")
    run = tiny_runs["transformer"]
    sets = {"test_2016_flickr": (["sieben", "zweiundvierzig"], ["seven", "forty-two"]),
            "test_2017_flickr": (["dreihundert", "elf", "acht"], ["three hundred", "eleven", "nine"])}
    for name, (sources, references) in sets.items():
        for lang, lines in (("de", sources), ("en", references)):
            with gzip.open(tmp_path / f"{name}.{lang}.gz", "wt", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines))
    other = tmp_path / "elsewhere"                   # --test NAME=PREFIX: plain files too
    other.mkdir()
    sets["ted"] = (["elf", "sieben", "acht"], ["eleven", "seven", "ten"])
    for lang, lines in zip(("de", "en"), sets["ted"]):
        (other / f"test.{lang}").write_text("".join(line + "\n" for line in lines))
    scores = quality.test_scores(run, str(tmp_path), {"ted": str(other / "test")})
    assert f"no test_2017_mscoco.de.gz and test_2017_mscoco.en.gz in {tmp_path}; that set is " \
           "skipped" in capsys.readouterr().err
    assert list(scores["test_sets"]) == ["test_2016_flickr", "test_2017_flickr", "ted"]
    translator = Translator.from_run(run)
    for name, (sources, references) in sets.items():
        alone = score_corpus([t.best.text for t in translator.translate(sources)], references)
        assert scores["test_sets"][name]["bleu"] == round(alone.bleu, 2)
        assert scores["test_sets"][name]["chrf"] == round(alone.chrf, 2)
        assert scores["test_sets"][name]["sentences"] == len(sources)


NUMBER_SETS = {"test_2016_flickr": (["dreihundertsiebzehn", "zweiundvierzig", "neunzehntausend"],
                                     ["three hundred seventeen", "forty-two", "nineteen thousand"]),
               "val": (["achtundachtzig", "elfhundert"], ["eighty-eight", "one thousand one hundred"])}


def write_number_sets(folder: Path) -> None:
    for name, (sources, references) in NUMBER_SETS.items():
        for lang, lines in (("de", sources), ("en", references)):
            with gzip.open(folder / f"{name}.{lang}.gz", "wt", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines))


def number_set_bleu(translator, name: str) -> float:
    from attnmt.evaluate import score_corpus

    sources, references = NUMBER_SETS[name]
    return round(score_corpus([t.best.text for t in translator.translate(sources)], references).bleu, 2)


def test_quality_scores_an_ensemble_as_translating_with_it(tiny_runs, tmp_path):
    from attnmt.translator import Translator

    quality = benchmark("quality")
    runs = [tiny_runs["transformer"], tiny_runs["rnn"]]
    write_number_sets(tmp_path)
    out = tmp_path / "ensemble.json"
    quality.record_ensemble(argparse.Namespace(ensemble=runs, average=None, data_dir=str(tmp_path),
                                               what="two tiny runs", out=out, export=None))
    record = json.loads(out.read_text())
    assert results.schema_errors(record) == []
    assert (record["what"], record["direction"], record["training"]) == ("two tiny runs", "de-en", None)
    ensemble = Translator.from_runs(runs)
    assert record["test_sets"]["test_2016_flickr"]["bleu"] == number_set_bleu(ensemble, "test_2016_flickr")
    assert record["extra"]["valid_bleu_beam5"] == number_set_bleu(ensemble, "val")
    assert record["extra"]["members_valid_bleu_beam5"] == {
        f"runs/{run.name}": number_set_bleu(Translator.from_run(run), "val") for run in runs}


def test_quality_scores_a_weight_average_as_translating_with_it(tiny_runs, tmp_path):
    from dataclasses import replace

    from attnmt.averaging import average_runs
    from attnmt.config import load_config, save_config
    from attnmt.train import train
    from attnmt.translator import Translator

    quality = benchmark("quality")
    first = tiny_runs["transformer"]
    (tmp_path / "tiny.yaml").write_text(TINY)
    second = train(tmp_path / "tiny.yaml", first.parent / "sibling",
                   ["train.max_steps=30", "train.validate_every=30", "train.seed=7",
                    "model.max_positions=40", f"data.tokenizer_from={first}"])
    soup = average_runs([first, second], tmp_path / "soup")
    config = load_config(soup / "config.yaml")      # a penalty of the soup's own (--write-alpha)
    save_config(replace(config, decode=replace(config.decode, alpha=1.3)), soup / "config.yaml")
    write_number_sets(tmp_path)
    out = tmp_path / "average.json"
    quality.record_ensemble(argparse.Namespace(ensemble=None, average=soup, data_dir=str(tmp_path),
                                               what=None, out=out, export=None))
    record = json.loads(out.read_text())
    assert results.schema_errors(record) == []
    assert record["what"] == f"average of runs/{first.name}, runs/sibling"
    averaged = Translator.from_run(soup)
    assert record["parameters"] == averaged.model.num_parameters()           # one model's
    assert record["test_sets"]["test_2016_flickr"]["bleu"] == number_set_bleu(averaged, "test_2016_flickr")
    assert record["extra"]["valid_bleu_beam5"] == number_set_bleu(averaged, "val")
    assert list(record["extra"]["members_valid_bleu_beam5"]) == [f"runs/{first.name}", "runs/sibling"]
    with pytest.raises(UserError, match="was not written by 'attnmt average'"):
        quality.averaged_runs(first)
    assert record["provenance"]["config"]["decode"]["alpha"] == 1.3      # the soup's, not a run's

    pytest.importorskip("ctranslate2", reason="exporting needs the ct2 extra")
    exported_out, export = tmp_path / "average_int8.json", tmp_path / "models" / "de-en"
    quality.record_ensemble(argparse.Namespace(ensemble=None, average=soup, data_dir=str(tmp_path),
                                               what=None, out=exported_out, export=export))
    record = json.loads(exported_out.read_text())
    assert results.schema_errors(record) == []
    exported = Translator.from_run(export)                            # int8, on CTranslate2
    assert record["extra"]["export"] == "DATA/models/de-en"           # under the data folder here
    assert record["test_sets"]["test_2016_flickr"]["bleu"] == number_set_bleu(exported, "test_2016_flickr")
    assert record["extra"]["valid_bleu_beam5"] == number_set_bleu(exported, "val")
    assert list(record["extra"]["members_valid_bleu_beam5"]) == [f"runs/{first.name}", "runs/sibling"]


def test_quality_records_a_pipelines_minutes_and_final_scores(tmp_path):
    quality = benchmark("quality")
    steps = {"fr_en": {"minutes": 63.5, "valid_bleu": 53.1, "test_bleu": None},
             "fr_en_int8": {"minutes": 0.5, "valid_bleu": None, "test_bleu": None},
             "scores": {"minutes": 2.0, "valid_bleu": None, "test_bleu": "test_2016_flickr 55.0"}}
    (tmp_path / "pipeline.json").write_text(json.dumps(steps))
    figures = quality.recipe_figures(tmp_path)
    assert figures == {"recipe_minutes": {"fr_en": 63.5, "fr_en_int8": 0.5, "scores": 2.0},
                       "recipe_hours": 1.1, "recipe_scores": {"scores": "test_2016_flickr 55.0"}}
    (tmp_path / "run.json").write_text(json.dumps(dict(RECORD, extra=figures)))
    assert results.render_table(["run"], ["recipe_hours", "recipe_scores"], tmp_path).splitlines()[2] == \
        "| 1.10 | test_2016_flickr 55.0 |"
    with pytest.raises(UserError, match="takes the --work folder of a finished 'attnmt pipeline'"):
        quality.recipe_figures(tmp_path / "elsewhere")
    (tmp_path / "pipeline.json").write_text("{broken")
    with pytest.raises(UserError, match="pipeline.json is not a pipeline's record"):
        quality.recipe_figures(tmp_path)


@pytest.mark.parametrize("extra,message", [
    (["--test", "ted=missing/test"], "quality.py: file not found: missing/test.de (nor missing/test.de.gz)"),
    (["--test", "ted=missing/test", "--set", "train.no_such_key=1"], "train.no_such_key"),
    (["--pipeline", "nowork"], "quality.py: nowork/pipeline.json does not exist"),
])
def test_quality_refuses_a_bad_test_set_config_or_pipeline_in_one_line_before_training(
        tmp_path, monkeypatch, extra, message):
    quality = benchmark("quality")
    config = Path(__file__).resolve().parents[1] / "configs" / "multi30k_de_en_transformer.yaml"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["quality.py", str(config), "--run", "run", *extra])
    with pytest.raises(SystemExit, match=re.escape(message)) as refused:
        quality.main()
    assert str(refused.value).startswith("quality.py: ") and "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_quality_refuses_an_ensemble_of_folders_that_are_not_runs_in_one_line(tmp_path, monkeypatch):
    quality = benchmark("quality")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["quality.py", "--ensemble", "a", "b", "--out", "e.json"])
    with pytest.raises(SystemExit, match="^quality.py: config file not found: a/config.yaml") as refused:
        quality.main()
    assert "\n" not in str(refused.value) and not (tmp_path / "e.json").exists()


def test_quality_writes_the_folders_of_a_record_as_the_documents_name_them(tmp_path, capsys):
    """The data folder becomes DATA, the run's parent runs and the repository ., wherever a
    string names them (inside an override too), the innermost first."""
    quality = benchmark("quality")
    data, work = tmp_path / "data" / "multi30k", tmp_path / "work"
    record = copy.deepcopy(RECORD)
    record["overrides"] = [f"data.synthetic=[{work}/back/pairs,{work}/ft/pairs]", f"data.dir={data}"]
    record["provenance"]["config"] = {"data": {"dir": str(data), "valid": f"{data}/val",
                                               "train": f"{data}2/train"}}
    assert results.schema_errors(record)
    names = {str(data): "DATA", work: "runs", tmp_path: "."}     # the repository holds the others
    portable = quality.without_machine_paths(record, names)
    assert portable["overrides"] == ["data.synthetic=[runs/back/pairs,runs/ft/pairs]", "data.dir=DATA"]
    assert portable["provenance"]["config"]["data"] == {"dir": "DATA", "valid": "DATA/val",
                                                       "train": "./data/multi30k2/train"}
    assert portable["test_sets"] == RECORD["test_sets"] and results.schema_errors(portable) == []
    quality.write_record(record, tmp_path / "quality.json", {str(data): "DATA", work: "runs"})
    written = json.loads((tmp_path / "quality.json").read_text())
    assert written["overrides"] == portable["overrides"]
    assert json.loads(capsys.readouterr().out) == {key: value for key, value in written.items()
                                                   if key != "provenance"}


def test_quality_names_a_recipe_steps_paths_inside_its_work_folder(tmp_path):
    """A step of a pipeline names the work folder's parent runs, so that its paths keep the
    recipe's folder; a run alone names its own parent runs."""
    quality = benchmark("quality")
    work = tmp_path / "en_cs_recipe"
    record = {"overrides": [f"data.synthetic=[{work}/distilled/pairs]"]}
    for pipeline, expected in ((work, "runs/en_cs_recipe/distilled/pairs"), (None, "runs/distilled/pairs")):
        args = argparse.Namespace(data_dir="", run=work / "student", pipeline=pipeline)
        portable = quality.without_machine_paths(record, quality.record_folders(args))
        assert portable["overrides"] == [f"data.synthetic=[{expected}]"]


@pytest.mark.parametrize("folders, names", [
    (["de_en", "de_en_bt"], ["runs/de_en", "runs/de_en_bt"]),
    (["a/en_fr", "b/seed2/en_fr"], ["runs/a/en_fr", "runs/b/seed2/en_fr"])])
def test_quality_names_an_ensembles_runs_apart_when_their_folders_share_a_name(folders, names, tmp_path,
                                                                              monkeypatch):
    quality = benchmark("quality")
    runs = [tmp_path / folder for folder in folders]
    members = {"extra": {"runs": [str(run.absolute()) for run in runs],           # as ensemble_record
                         "members_valid_bleu_beam5": {str(run.absolute()): 40.0 for run in runs}}}
    monkeypatch.setattr(quality, "ensemble_record", lambda *args: members)
    out = tmp_path / "ensemble.json"
    quality.record_ensemble(argparse.Namespace(ensemble=runs, average=None, data_dir="", what=None,
                                               out=out, export=None))
    written = json.loads(out.read_text())
    assert written["extra"]["runs"] == names
    assert list(written["extra"]["members_valid_bleu_beam5"]) == names


@pytest.mark.parametrize("runs, out, message", [
    (["a", "./a"], "e.json", "--ensemble: a run is named twice; an ensemble's runs differ"),
    (["a", "b"], "no/e.json", "--out no/e.json: the folder no does not exist"),
    (["a", "b", "--export", "models/a"], "e.json", "--out and optionally --export), and no CONFIG, "
                                                    "--run, --set, --test, --made-by or --pipeline"),
    (["a", "b", "--made-by", "attnmt synthesize a -i x -o y"], "e.json", "--made-by or --pipeline")])
def test_quality_refuses_a_wrong_ensemble_before_scoring(runs, out, message, tmp_path, monkeypatch,
                                                          capsys):
    quality = benchmark("quality")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(quality, "ensemble_record", lambda *args: pytest.fail("scored before refusing"))
    monkeypatch.setattr(sys, "argv", ["quality.py", "--ensemble", *runs, "--out", out])
    with pytest.raises(SystemExit):
        quality.main()
    assert capsys.readouterr().err.splitlines()[-1].endswith(message)

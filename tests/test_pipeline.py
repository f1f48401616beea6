"""attnmt pipeline: a recipe's steps in order, skipped when done, resumed when killed."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError
from attnmt.pipeline import Pipeline
from conftest import TINY


def pipeline(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "attnmt", "pipeline", *map(str, args)],
                          capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture
def recipe_folder(tmp_path):
    """The tiny config and a text of English number words beside the recipes of a test."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    text = numbers_corpus("train", "de", "en", 999, {"train": 80, "valid": 0, "test": 0}, 5)
    (tmp_path / "mono.en").write_text("".join(line + "\n" for line in text.target))
    (tmp_path / "test.de").write_text("sieben\nzweiundvierzig\n")
    (tmp_path / "test.en").write_text("seven\nforty-two\n")
    return tmp_path


CHAIN = """
steps:
  score:                               # listed first, runs last: it names the others
    evaluate: [teacher]
    test: [test]
  teacher:
    train: tiny.yaml
    set: ["data.synthetic=[@back]", train.max_steps=30, train.validate_every=30]
  reverse:
    train: tiny.yaml
    set: [data.src_lang=en, data.tgt_lang=de, train.max_steps=30, train.validate_every=30]
  back:
    synthesize: reverse
    input: mono.en
    beam: 2
"""


def test_a_recipe_runs_in_order_and_a_second_run_does_nothing(recipe_folder):
    (recipe_folder / "chain.yaml").write_text(CHAIN)
    work = recipe_folder / "work"
    dry = pipeline(recipe_folder / "chain.yaml", "--work", work, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    order = [line.split()[1] + " " + line.split()[2] for line in dry.stdout.splitlines()]
    assert order == [f"train {recipe_folder / 'tiny.yaml'}", f"synthesize {work / 'reverse'}",
                     f"train {recipe_folder / 'tiny.yaml'}", f"evaluate {work / 'teacher'}"]
    assert f"--set data.synthetic=[{work / 'back' / 'pairs'}]" in dry.stdout.replace("'", "")
    assert not work.exists()

    first = pipeline(recipe_folder / "chain.yaml", "--work", work)
    assert first.returncode == 0, first.stderr
    assert json.loads((work / "pipeline.json").read_text()).keys() == \
        {"reverse", "back", "teacher", "score"}
    assert (work / "back" / "pairs.de").read_text().count("\n") == 80
    assert (work / "teacher" / "best.safetensors").is_file()
    assert "| test | 2 |" in (work / "score" / "scores.txt").read_text()
    table = first.stdout.split("| step |")[1]
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == \
        ["reverse", "back", "teacher", "score"]
    assert all(line.split("|")[2].strip() == "ran" for line in table.splitlines()[2:])

    second = pipeline(recipe_folder / "chain.yaml", "--work", work)
    assert second.returncode == 0 and "nothing to run" in second.stdout
    assert "done before" in second.stdout and "[reverse]" not in second.stdout

    (recipe_folder / "chain.yaml").write_text(CHAIN.replace("train.max_steps=30, train.validate",
                                                            "train.max_steps=60, train.validate", 1))
    changed = pipeline(recipe_folder / "chain.yaml", "--work", work)
    assert changed.returncode == 1 and "Traceback" not in changed.stderr
    assert "step teacher in" in changed.stderr and "made by another command" in changed.stderr
    assert "train.max_steps=30" in changed.stderr and "train.max_steps=60" in changed.stderr


def test_a_killed_step_resumes_to_the_same_outputs(recipe_folder):
    (recipe_folder / "long.yaml").write_text(
        "steps:\n  model:\n    train: tiny.yaml\n    set: [train.max_steps=200, train.validate_every=50]\n")
    reference = pipeline(recipe_folder / "long.yaml", "--work", recipe_folder / "reference")
    assert reference.returncode == 0, reference.stderr
    work = recipe_folder / "killed"
    victim = subprocess.Popen([sys.executable, "-m", "attnmt", "pipeline", recipe_folder / "long.yaml",
                               "--work", work], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    log, deadline = work / "model" / "log.csv", time.time() + 240
    while time.time() < deadline:
        steps = [int(line.split(",")[0]) for line in log.read_text().splitlines()[1:]] \
            if log.is_file() else []
        if steps and max(steps) >= 70:
            break
        time.sleep(0.02)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert not (work / "pipeline.json").exists()
    resumed = pipeline(recipe_folder / "long.yaml", "--work", work)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in (work / "model.log").read_text()
    ours, theirs = (load_file(str(folder / "model" / "last.safetensors"))
                    for folder in (work, recipe_folder / "reference"))
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def trainer_of(run: Path, deadline: float) -> int:
    """The process id training ``run``, once it has written its first validation row."""
    log = run / "log.csv"
    while not (log.is_file() and len(log.read_text().splitlines()) > 1):
        assert time.time() < deadline, "the step never started training"
        time.sleep(0.05)
    return int((run / ".lock").read_text())


def ended(pid: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_pipeline_stops_its_step(recipe_folder, stop):
    # After `kill -TERM` of the pipeline its `attnmt train` went on, reparented to init.
    (recipe_folder / "long.yaml").write_text(
        "steps:\n  model:\n    train: tiny.yaml\n    set: [train.max_steps=100000, "
        "train.validate_every=20]\n")
    work = recipe_folder / "work"
    victim = subprocess.Popen([sys.executable, "-m", "attnmt", "pipeline", recipe_folder / "long.yaml",
                               "--work", work], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    trainer = trainer_of(work / "model", time.time() + 240)
    victim.send_signal(stop)                                      # the pipeline alone
    victim.wait(timeout=60)
    try:
        assert ended(trainer, 30), "the step outlived the pipeline"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(trainer, signal.SIGKILL)
    if stop == signal.SIGTERM:
        assert "stopped by SIGTERM, and so was the step train" in victim.stderr.read()
    minutes = (work / "model.log").read_text()
    assert minutes.count("[pipeline] minutes of this try") == (stop == signal.SIGTERM)


def test_a_run_being_trained_is_not_trained_twice(tiny_config, tmp_path):
    (tmp_path / "run").mkdir()
    hold = ("import sys, time; from attnmt.run import RunDirectory\n"
            "with RunDirectory(sys.argv[1]).held():\n    print(1, flush=True)\n    time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "run")],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"1"
        second = subprocess.run([sys.executable, "-m", "attnmt", "train", tiny_config, "--run-dir",
                                 tmp_path / "run", "--set", "train.max_steps=2"], capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 1
        assert second.stderr.strip() == (f"attnmt: error: {tmp_path / 'run'} is being trained by "
                                         f"process {holder.pid}; wait for it to end or stop it, then "
                                         "run the command again to resume")
    finally:
        holder.kill()
        holder.wait()
    again = subprocess.run([sys.executable, "-m", "attnmt", "train", tiny_config, "--run-dir",
                            tmp_path / "run", "--set", "train.max_steps=2",
                            "--set", "train.validate_every=2"], capture_output=True, timeout=120)
    assert again.returncode == 0, again.stderr


def test_a_failing_step_stops_the_pipeline_and_keeps_what_was_done(recipe_folder):
    (recipe_folder / "broken.yaml").write_text("""
steps:
  model:
    train: tiny.yaml
    set: [train.max_steps=20, train.validate_every=20]
  back:
    synthesize: model
    input: missing.txt
  after:
    export: back
""")
    work = recipe_folder / "work"
    failed = pipeline(recipe_folder / "broken.yaml", "--work", work)
    assert failed.returncode == 1
    assert failed.stderr == (f"attnmt: error: step back failed: attnmt: error: file not found: "
                             f"missing.txt (its log: {work / 'back.log'}); the steps before it "
                             "are kept\n")
    assert json.loads((work / "pipeline.json").read_text()).keys() == {"model"}
    assert (work / "model" / "best.safetensors").is_file()


def test_a_penalty_step_writes_the_alpha_that_the_steps_written_after_it_decode_with(
        recipe_folder, tiny_runs):
    """An evaluate step with several penalties and write_alpha, on val, chooses the run's
    length penalty; its record names each penalty's BLEU, and the step written after it
    (naming neither) runs after it, decoding with the chosen one."""
    from attnmt.evaluate import score_corpus
    from attnmt.translator import Translator

    shutil.copytree(tiny_runs["transformer"], recipe_folder / "model")
    translator = Translator.from_run(recipe_folder / "model")
    sources = ["sieben", "zweiundvierzig", "dreihundert", "elf", "acht"]
    strong = [t.best.text for t in translator.translate(sources, beam=4, alpha=3.0)]
    (recipe_folder / "val.de").write_text("".join(s + "\n" for s in sources))
    (recipe_folder / "val.en").write_text("".join(r + "\n" for r in strong))
    bleu = {alpha: score_corpus([t.best.text for t in translator.translate(
        sources, beam=4, alpha=alpha)], strong).bleu for alpha in (0.0, 3.0)}
    (recipe_folder / "choose.yaml").write_text("""
steps:
  penalty: {evaluate: [./model], test: [val], beam: 4, alpha: [0, 3], write_alpha: true}
  score: {evaluate: [./model], test: [val], beam: 4}
""")
    result = pipeline(recipe_folder / "choose.yaml", "--work", recipe_folder / "work")
    assert result.returncode == 0, result.stderr
    record = json.loads((recipe_folder / "work" / "pipeline.json").read_text())
    assert record["penalty"]["test_bleu"] == \
        f"val alpha 0.0 {bleu[0.0]:.2f}, val alpha 3.0 {bleu[3.0]:.2f} (wrote alpha 3.0)"
    assert record["score"]["test_bleu"] == f"val {bleu[3.0]:.2f}" != f"val {bleu[0.0]:.2f}"


def test_a_step_records_the_minutes_of_every_try(tmp_path, monkeypatch):
    """A recipe's compute is what its outputs cost: a step that failed once, was stopped
    with Ctrl-C once and then finished records the minutes of all three tries."""
    import attnmt.pipeline as module

    (tmp_path / "one.yaml").write_text("steps:\n  fast:\n    export: runs/model\n")
    clock, outcomes = [0.0], iter([1, KeyboardInterrupt, 0])

    def fake_run(arguments, log):              # each try takes 2, 3 and 4 minutes
        clock[0] += 60 * (2 + fake_run.tries)
        fake_run.tries += 1
        outcome = next(outcomes)
        log.write("the step's own last line\n")
        if outcome is KeyboardInterrupt:
            raise KeyboardInterrupt
        return outcome

    fake_run.tries = 0
    monkeypatch.setattr(module, "run_step_process", fake_run)
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock[0])
    plan = Pipeline(tmp_path / "one.yaml", tmp_path / "work")
    with pytest.raises(UserError, match="step fast failed: the step's own last line "):
        plan.run(echo=lambda line: None)
    with pytest.raises(KeyboardInterrupt):
        plan.run(echo=lambda line: None)
    assert not (tmp_path / "work" / "pipeline.json").exists()
    assert plan.run(echo=lambda line: None)[0]["minutes"] == 9.0
    assert json.loads((tmp_path / "work" / "pipeline.json").read_text())["fast"]["minutes"] == 9.0


@pytest.mark.parametrize("recipe,message", [
    ("steps:\n  a: {train: x.yaml, export: y}\n", "step a: give exactly one of"),
    ("steps:\n  a: {export: b}\n", "step a names 'b', which is not a step"),
    ("steps:\n  a: {export: b}\n  b: {export: a}\n", "depends on itself"),
    ("steps:\n  a: {train: x.yaml, beam: 5}\n", "step a: train takes set, not 'beam'"),
    ("steps:\n  a: {average: [x/b, x/c], beam: 5}\n", "step a: average takes no options, not 'beam'"),
    ("stages: {}\n", "a recipe is a mapping with 'steps'"),
    ("steps: [1, 2\n", "is not valid YAML"),
])
def test_a_bad_recipe_is_one_line(tmp_path, recipe, message):
    (tmp_path / "bad.yaml").write_text(recipe)
    with pytest.raises(UserError, match=message):
        Pipeline(tmp_path / "bad.yaml")


@pytest.mark.parametrize("value", ["data.train=corpus/**", "data.train=" + "x" * 5000,
                                   "data.train=a[b", "data.train=corpus/*.gz"])
def test_any_setting_plans_as_written(tmp_path, value):
    # '**' ended the dry run in a traceback; a long value in "File name too long".
    (tmp_path / "recipe.yaml").write_text(f"steps:\n  a: {{train: x.yaml, set: ['{value}']}}\n")
    planned = Pipeline(tmp_path / "recipe.yaml", tmp_path / "work").command(
        Pipeline(tmp_path / "recipe.yaml").steps[0])
    assert planned[-1] == value


def test_an_average_step_reads_its_runs_and_is_read_as_a_run(recipe_folder):
    (recipe_folder / "soup.yaml").write_text(
        "steps:\n  fast: {export: soup}\n  soup: {average: [one, two]}\n"
        "  one: {train: tiny.yaml}\n  two: {train: tiny.yaml, set: [train.init_from=@one]}\n")
    work = recipe_folder / "work"
    plan = Pipeline(recipe_folder / "soup.yaml", work)
    assert [step.name for step in plan.steps] == ["one", "two", "soup", "fast"]
    assert plan.command(plan.by_name["soup"]) == ["average", str(work / "one"), str(work / "two"),
                                                 "-o", str(work / "soup"), "--force"]
    assert plan.command(plan.by_name["fast"])[1] == str(work / "soup")


@pytest.mark.parametrize("name", ["numbers", "de_en"])
def test_the_shipped_recipes_read(name):
    recipe = Path(__file__).resolve().parents[1] / "recipes" / f"{name}.yaml"
    pipeline = Pipeline(recipe)
    steps = [step.name for step in pipeline.steps]
    assert steps.index("back") > steps.index("en_de" if name == "de_en" else "reverse")
    for step in pipeline.steps:                        # every command resolves
        assert pipeline.command(step)[0] == step.action


@pytest.mark.parametrize("name", ["de_en", "en_de", "fr_en", "en_fr", "cs_en", "en_cs"])
def test_every_shipped_direction_recipe_plans_a_valid_chain(name, tmp_path, monkeypatch):
    """A recipe of hours must not fail at its last step: every training's config and
    settings load (a mistyped key would be refused), every step it needs comes before
    it, and it ends by scoring the final model's export on the direction's test sets."""
    from attnmt.config import load_config

    monkeypatch.setenv("ATTNMT_DATA", str(tmp_path / "data"))
    recipe = Path(__file__).resolve().parent.parent / "recipes" / f"{name}.yaml"
    plan = Pipeline(recipe, tmp_path / "work")
    seen = []
    for step in plan.steps:
        assert set(step.references()) <= set(seen), f"{step.name} needs a later step"
        seen.append(step.name)
        arguments = plan.command(step)
        if step.action == "train":
            settings = [arguments[i + 1] for i, word in enumerate(arguments) if word == "--set"]
            load_config(arguments[1], settings)
    src, tgt = name.split("_")
    final = plan.steps[-1]
    assert final.action == "evaluate" and plan.by_name[final.target[0]].action == "export"
    trained = plan.by_name[plan.by_name[final.target[0]].target]
    while trained.action == "average":                 # the mean of runs: its first run's config
        trained = plan.by_name[trained.target[0]]
    config = load_config(plan.command(trained)[1], [
        s for s in plan.command(trained) if s.startswith("data.") and "lang=" in s])
    assert (config.data.src_lang, config.data.tgt_lang) == (src, tgt)
    expected = ["test_2016_flickr"] + (["test_2017_flickr", "test_2017_mscoco"]
                                       if "cs" not in name else [])
    assert [Path(t).name for t in final.options["test"]] == expected

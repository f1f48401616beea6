"""The deployment install (``pip install ./deploy``): attnmt without PyTorch, translating and
serving a folder made by ``attnmt export`` exactly as the full toolkit does.

The environment is made by ``.ci/run`` with the README's deployment command and named by
``$ATTNMT_DEPLOY_PYTHON``; without it these tests skip (in CI they fail instead).
"""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from attnmt.data.numbers import numbers_corpus

from test_libretranslate import clients_talk_to
from test_serve import free_port, start_server

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed (pip install -e \".[ct2]\")")

TEXTS = numbers_corpus("test", "de", "en", 999, {"train": 0, "valid": 0, "test": 60}, seed=4).source
TEXTS += ["", "   \t ", "\x00\x01sieben\x1b", "sieben"]


@pytest.fixture(scope="module")
def deploy_python() -> str:
    python = os.environ.get("ATTNMT_DEPLOY_PYTHON", "")
    if python and Path(python).is_file():
        return python
    message = ("no deployment environment: python -m venv .venv-deploy && .venv-deploy/bin/pip "
               "install ./deploy, then ATTNMT_DEPLOY_PYTHON=.venv-deploy/bin/python")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (.ci/run makes it: missing there is an error)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def exported(tiny_runs, tmp_path_factory):
    from attnmt.export import export_run

    return export_run(tiny_runs["transformer"], tmp_path_factory.mktemp("deploy") / "exported")


def attnmt(python: str, *args, stdin: str = ""):
    return subprocess.run([python, "-m", "attnmt", *args], input=stdin, capture_output=True,
                          text=True, timeout=300)


def test_the_environment_has_no_torch_and_training_says_so_in_one_line(deploy_python, tmp_path):
    assert subprocess.run([deploy_python, "-c", "import torch"], capture_output=True).returncode != 0
    (tmp_path / "c.yaml").write_text("data:\n  dataset: numbers\n")
    for command, needs in ((["train", str(tmp_path / "c.yaml")], "training needs PyTorch"),
                           (["export", "run", "out"], "exporting a run needs PyTorch"),
                           (["export", "run", "out", "--format", "transformers"],
                            "exporting a run needs PyTorch"),
                           (["import", "folder", "--run-dir", "r"], "importing a MarianMT model needs PyTorch"),
                           (["average", "a", "b", "-o", "c"], "averaging runs needs PyTorch")):
        result = attnmt(deploy_python, *command)
        assert result.returncode == 1
        assert result.stderr == f"attnmt: error: {needs}: pip install torch==2.13.0\n"


@pytest.mark.parametrize("beam", ["1", "4"])
def test_an_export_translates_as_in_the_full_environment(deploy_python, exported, beam):
    lines = "".join(f"{text}\n" for text in TEXTS)
    here = attnmt(sys.executable, "translate", str(exported), "--beam", beam, "--threads", "1",
                  stdin=lines)
    there = attnmt(deploy_python, "translate", str(exported), "--beam", beam, "--threads", "1",
                   stdin=lines)
    assert here.returncode == there.returncode == 0, there.stderr
    assert there.stdout == here.stdout
    outputs = there.stdout.splitlines()
    assert len(outputs) == len(TEXTS) and outputs[-4:-2] == ["", ""] and outputs[-2] == outputs[-1]


def test_evaluate_in_the_deployment_environment(deploy_python, exported, tmp_path):
    (tmp_path / "src.de").write_text("sieben\nzweiundvierzig\n")
    (tmp_path / "ref.en").write_text("seven\nforty-two\n")
    result = attnmt(deploy_python, "evaluate", str(exported), "--src", str(tmp_path / "src.de"),
                    "--ref", str(tmp_path / "ref.en"), "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert "BLEU" in result.stdout and "chrF" in result.stdout


def test_serve_in_the_deployment_environment(deploy_python, exported):
    from attnmt.translator import Translator

    port = free_port()
    server = start_server(deploy_python, exported, port)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/translate", method="POST",
            data=json.dumps({"texts": TEXTS[:8] + TEXTS[-4:], "beam": 3}).encode(),
            headers={"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
        info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=5).read())
    finally:
        server.terminate()
        server.wait(timeout=30)
    expected = Translator.from_run(exported, threads=1).translate(TEXTS[:8] + TEXTS[-4:], beam=3)
    assert [t["translation"] for t in answer["translations"]] == [t.best.text for t in expected]
    assert info["engine"] == "ctranslate2" and info["parameters"] > 0


@pytest.mark.parametrize("command", [["translate"], ["evaluate", "--src", "{src}", "--ref", "{src}"]])
def test_an_export_never_imports_torch_even_where_it_is_installed(exported, tmp_path, command):
    (tmp_path / "src.de").write_text("sieben\n")
    arguments = [part.format(src=tmp_path / "src.de") for part in command]
    probe = ("import sys; from attnmt.cli import main; code = main(sys.argv[1:]); "
             "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", probe, arguments[0], str(exported), *arguments[1:],
                             "--threads", "1"], input="sieben\n", capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "False"


def test_libretranslate_clients_talk_to_the_deployment_install(deploy_python, exported, french_run,
                                                               tmp_path):
    from attnmt.export import export_run

    french = export_run(french_run, tmp_path / "fr_en")
    clients_talk_to(deploy_python, [f"de_en={exported}", f"fr_en={french}"])


def test_the_shipped_models_install_with_the_deployment_environment(deploy_python, tmp_path):
    """Run outside the repository, so that the installed package (and its models) answers."""
    def installed(*args, stdin=""):
        return subprocess.run([deploy_python, "-m", "attnmt", *args], input=stdin, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    where = subprocess.run([deploy_python, "-c", "import attnmt.shipped as s; "
                            "print(s.models_folder())"], cwd=tmp_path, capture_output=True, text=True)
    assert "site-packages/attnmt/shipped_models" in where.stdout, where.stdout + where.stderr
    listed = installed("models")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[:6]] == [
        "cs-en", "de-en", "en-cs", "en-de", "en-fr", "fr-en"]
    translated = installed("translate", "de-en", stdin="Ein Hund rennt.\n")
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr
    plot = installed("plot", "de-en", "Ein Hund rennt.", "-o", str(tmp_path / "a.png"))
    assert plot.returncode == 1
    assert plot.stderr == "attnmt: error: drawing needs matplotlib: pip install matplotlib\n"

"""The ``attnmt`` command as a user runs it: a subprocess, its output, its exit status."""

import shutil
import subprocess
import sys

import yaml

from attnmt.cli import build_parser


def attnmt(*args, stdin=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "attnmt", *args], input=stdin,
                          capture_output=True, timeout=120, cwd=cwd)


def test_every_command_has_help_and_no_command_prints_usage():
    result = attnmt("--help")
    assert result.returncode == 0 and b"translate" in result.stdout
    imports = subprocess.run([sys.executable, "-c", "import sys, attnmt.cli; "
                              "attnmt.cli.build_parser(); print('torch' in sys.modules)"],
                             capture_output=True, text=True, timeout=60)
    assert imports.stdout.strip() == "False"               # --help stays fast: no torch
    for command in ("demo", "prepare", "train", "translate", "evaluate", "plot", "serve",
                    "experiment"):
        assert attnmt(command, "--help").returncode == 0, command
    bare = attnmt()
    assert bare.returncode == 2 and b"usage: attnmt" in bare.stderr


def test_run_directory_is_spelled_run_dir_or_run():
    parser = build_parser()
    for option in ("--run-dir", "--run"):
        args = parser.parse_args(["train", "c.yaml", option, "runs/x"])
        assert args.run == "runs/x"


def test_cli_translate_plain_nbest_and_alignment(tiny_runs):
    run = tiny_runs["transformer"]
    lines = "sieben\n\nzweiundvierzig\n"
    plain = attnmt("translate", str(run), "--threads", "1", stdin=lines.encode())
    assert plain.returncode == 0 and len(plain.stdout.decode().splitlines()) == 3
    nbest = attnmt("translate", str(run), "--threads", "1", "--n-best", "2", "--alignment",
                   stdin=lines.encode())
    rows = [row.split(" ||| ") for row in nbest.stdout.decode().splitlines()]
    assert [row[0] for row in rows] == ["0", "0", "1", "2", "2"]     # empty input: one empty line
    assert rows[2][1:3] == ["", "0.0000"]
    assert all(len(row) == 4 for row in rows)
    float(rows[0][2])


def test_cli_translate_bad_utf8_is_one_line(tiny_runs):
    run = tiny_runs["transformer"]
    result = attnmt("translate", str(run), "--threads", "1", stdin=b"sieben\n\xff\xfe\n")
    assert result.returncode == 1
    assert result.stderr.decode().strip() == "attnmt: error: standard input: line 2 is not valid UTF-8"
    assert b"Traceback" not in result.stderr


def test_cli_evaluate_prints_scores_and_buckets(tiny_runs, tmp_path):
    run = tiny_runs["transformer"]
    (tmp_path / "src.txt").write_text("sieben\nzweiundvierzig\n")
    (tmp_path / "ref.txt").write_text("seven\nforty-two\n")
    result = attnmt("evaluate", str(run), "--threads", "1", "--src", str(tmp_path / "src.txt"),
                    "--ref", str(tmp_path / "ref.txt"), "--by-length", "--beam", "2")
    output = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    assert "BLEU" in output and "chrF" in output and "signature: nrefs:1" in output
    assert "0-9 |         2 |" in output
    (tmp_path / "ref.txt").write_text("seven\n")
    mismatch = attnmt("evaluate", str(run), "--src", str(tmp_path / "src.txt"),
                      "--ref", str(tmp_path / "ref.txt"))
    assert mismatch.returncode == 1 and b"line counts differ" in mismatch.stderr


def test_cli_evaluate_never_writes_its_hypotheses_over_what_it_reads(tiny_runs, tmp_path):
    # `evaluate RUN --src t.de --ref t.en --hyp t.en` wrote the hypotheses over the reference.
    (tmp_path / "t.de").write_text("sieben\n")
    (tmp_path / "t.en").write_text("seven\n")
    for hyp in ("t.en", "t.de", "./t.en"):
        refused = attnmt("evaluate", str(tiny_runs["transformer"]), "--src",
                         str(tmp_path / "t.de"), "--ref", str(tmp_path / "t.en"), "--hyp", hyp,
                         cwd=tmp_path)
        assert refused.returncode == 1 and b"is one of the files evaluate reads" in refused.stderr
    assert (tmp_path / "t.en").read_text() == "seven\n"
    assert (tmp_path / "t.de").read_text() == "sieben\n"


def test_cli_evaluate_scores_several_test_sets(tiny_runs, tmp_path):
    from attnmt.evaluate import score_corpus, tokenized_lowercased_bleu
    from attnmt.translator import Translator

    run = tiny_runs["transformer"]
    sets = {"first": (["sieben", "zweiundvierzig"], ["seven", "forty-two"]),
            "second": (["dreihundert", "elf", "acht"], ["three hundred", "eleven", "nine"])}
    for name, (sources, references) in sets.items():
        (tmp_path / f"{name}.de").write_text("".join(s + "\n" for s in sources))
        (tmp_path / f"{name}.en").write_text("".join(r + "\n" for r in references))
    result = attnmt("evaluate", str(run), "--threads", "1", "--beam", "2", "--test",
                    str(tmp_path / "first"), str(tmp_path / "second"))
    assert result.returncode == 0, result.stderr.decode()
    table = result.stdout.decode().split("| test set |")[1].splitlines()[2:]
    translator = Translator.from_run(run)
    for line, (name, (sources, references)) in zip(table, sets.items()):
        hypotheses = [t.best.text for t in translator.translate(sources, beam=2)]
        expected = score_corpus(hypotheses, references)
        literature = tokenized_lowercased_bleu(hypotheses, references, "en")
        assert line == (f"| {name} | {len(sources)} | {expected.bleu:.2f} | {expected.chrf:.2f} "
                        f"| {expected.ter:.2f} | {literature:.2f} |")
    assert len(table) == 2
    missing = attnmt("evaluate", str(run), "--test", str(tmp_path / "first"), str(tmp_path / "third"))
    assert missing.returncode == 1
    assert missing.stderr.decode().strip() == f"attnmt: error: file not found: {tmp_path / 'third.de'} " \
                                              f"(nor {tmp_path / 'third.de'}.gz)"
    both = attnmt("evaluate", str(run), "--test", str(tmp_path / "first"), "--src", "x", "--ref", "y")
    assert both.returncode == 1 and b"not both" in both.stderr


def test_cli_evaluate_scores_each_length_penalty_as_alone_and_names_the_best(tiny_runs, tmp_path):
    from attnmt.evaluate import score_corpus
    from attnmt.translator import Translator

    run = tiny_runs["transformer"]
    translator = Translator.from_run(run)
    sources = ["sieben", "zweiundvierzig", "dreihundert", "elf", "acht"]
    # references that the strong penalty's outputs match, so that it scores higher
    references = [t.best.text for t in translator.translate(sources, beam=4, alpha=3.0)]
    (tmp_path / "val.de").write_text("".join(s + "\n" for s in sources))
    (tmp_path / "val.en").write_text("".join(r + "\n" for r in references))
    result = attnmt("evaluate", str(run), "--threads", "1", "--beam", "4", "--test",
                    str(tmp_path / "val"), "--alpha", "0", "3")
    assert result.returncode == 0, result.stderr.decode()
    output = result.stdout.decode()
    table = output.split("| test set | alpha |")[1].splitlines()[2:4]
    expected = {alpha: score_corpus([t.best.text for t in translator.translate(
        sources, beam=4, alpha=alpha)], references, lang="en") for alpha in (0.0, 3.0)}
    assert expected[0.0].bleu < 99 < expected[3.0].bleu
    assert table == [f"| val | {alpha} | 5 | {scores.bleu:.2f} | {scores.chrf:.2f} | "
                     f"{scores.ter:.2f} | {scores.bleu_tok_lc:.2f} |"
                     for alpha, scores in expected.items()]
    best = max(expected, key=lambda alpha: expected[alpha].bleu)
    assert f"highest BLEU on val: alpha {best} ({expected[best].bleu:.2f})" in output
    one_file = attnmt("evaluate", str(run), "--test", str(tmp_path / "val"), "--alpha", "0", "3",
                      "--hyp", str(tmp_path / "hyp.txt"))
    assert one_file.returncode == 1 and not (tmp_path / "hyp.txt").exists()
    assert one_file.stderr.decode().strip() == \
        "attnmt: error: --hyp writes one file: give one test set and one --alpha with it"
    negative = attnmt("evaluate", str(run), "--test", str(tmp_path / "val"), "--alpha", "0", "-1")
    assert negative.returncode == 1 and not negative.stdout      # refused before decoding
    assert negative.stderr.decode().strip() == \
        "attnmt: error: alpha (the length penalty) must be >= 0, got -1.0"


def test_cli_evaluate_writes_the_penalty_of_highest_bleu_as_the_runs_default(tiny_runs, tmp_path):
    from attnmt.translator import Translator

    run = tmp_path / "run"
    shutil.copytree(tiny_runs["transformer"], run)
    sources = ["sieben", "zweiundvierzig", "dreihundert", "elf", "acht"]
    translator = Translator.from_run(run)
    strong = [t.best.text for t in translator.translate(sources, beam=4, alpha=3.0)]
    assert [t.best.text for t in translator.translate(sources, beam=4)] != strong   # the default
    (tmp_path / "val.de").write_text("".join(s + "\n" for s in sources))
    (tmp_path / "val.en").write_text("".join(r + "\n" for r in strong))
    before = yaml.safe_load((run / "config.yaml").read_text())
    val = tmp_path / "val"
    for refused in ([run, run, "--test", val, "--alpha", "0", "3"],      # an ensemble
                    [run, "--test", val, val, "--alpha", "0", "3"],      # two sets
                    [run, "--test", val]):                               # nothing to choose
        result = attnmt("evaluate", *map(str, refused), "--write-alpha")
        assert result.returncode == 1 and not result.stdout, refused
        assert result.stderr.decode().startswith("attnmt: error: --write-alpha writes one run's ")
    assert yaml.safe_load((run / "config.yaml").read_text()) == before

    chosen = attnmt("evaluate", str(run), "--threads", "1", "--beam", "4", "--test",
                    str(val), "--alpha", "0", "3", "--write-alpha")
    assert chosen.returncode == 0, chosen.stderr.decode()
    assert chosen.stdout.decode().splitlines()[-1] == f"decode.alpha 3.0 written to {run / 'config.yaml'}"
    after = yaml.safe_load((run / "config.yaml").read_text())
    assert after["decode"]["alpha"] == 3.0 != before["decode"]["alpha"]
    assert {**after, "decode": {**after["decode"], "alpha": before["decode"]["alpha"]}} == before
    default = attnmt("translate", str(run), "--threads", "1", "--beam", "4",
                     stdin="".join(s + "\n" for s in sources).encode())
    assert default.stdout.decode().splitlines() == strong          # later commands decode with it


def test_cli_refuses_missing_run_and_corrupt_checkpoint(tiny_runs, tmp_path):
    run = tiny_runs["transformer"]
    missing = attnmt("translate", str(tmp_path / "nowhere"), stdin=b"x\n")
    assert missing.returncode == 1 and b"nowhere: no such run or export folder" in missing.stderr
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 64)
    corrupt = attnmt("translate", str(run), "--checkpoint", str(broken), stdin=b"x\n")
    assert corrupt.returncode == 1
    assert corrupt.stderr.decode().strip() == (f"attnmt: error: {broken} is not a valid checkpoint "
                                               f"for this model ({corrupt.stderr.decode().split('(', 1)[1].strip()}")


def test_cli_missing_input_file_is_one_line(tiny_runs, tmp_path):
    run = tiny_runs["transformer"]
    result = attnmt("translate", str(run), "-i", str(tmp_path / "absent.txt"))
    assert result.returncode == 1
    assert result.stderr.decode().strip() == f"attnmt: error: file not found: {tmp_path / 'absent.txt'}"



def test_cli_translate_samples(tiny_runs):
    run = tiny_runs["transformer"]
    options = ["translate", str(run), "--threads", "1", "--sample", "--n-best", "3",
               "--temperature", "1.5", "--top-p", "0.9", "--seed", "11"]
    first = attnmt(*options, stdin="dreihundertzwölf\n".encode())
    assert first.returncode == 0, first.stderr.decode()
    rows = [row.split(" ||| ") for row in first.stdout.decode().splitlines()]
    assert [row[0] for row in rows] == ["0", "0", "0"]
    assert attnmt(*options, stdin="dreihundertzwölf\n".encode()).stdout == first.stdout
    bad = attnmt("translate", str(run), "--sample", "--top-p", "1.5", stdin=b"x\n")
    assert bad.returncode == 1
    assert bad.stderr.decode().strip() == "attnmt: error: top-p must be in (0, 1], got 1.5"


def test_plot_command_prints_the_png_path(tiny_runs, tmp_path):
    result = subprocess.run([sys.executable, "-m", "attnmt", "plot", str(tiny_runs["rnn"]), "sieben",
                             "-o", str(tmp_path / "c.png"), "--threads", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == str(tmp_path / "c.png")


def test_served_models_are_named_by_their_folder_or_by_name():
    import pytest

    from attnmt.cli import named_runs
    from attnmt.errors import UserError

    assert named_runs(["runs/tf", "rnn=runs/bahdanau", "runs/a=b"]) == [
        ("tf", "runs/tf"), ("rnn", "runs/bahdanau"), ("a=b", "runs/a=b")]
    with pytest.raises(UserError, match="two served models are named 'tf'; name them with NAME=RUN"):
        named_runs(["old/tf", "new/tf"])


def test_target_lang_on_a_bilingual_run_is_one_line(tiny_runs):
    result = attnmt("translate", str(tiny_runs["transformer"]), "--target-lang", "fr", stdin=b"sieben\n")
    assert result.returncode == 1
    assert result.stderr.decode() == ("attnmt: error: target language 'fr': this model translates "
                                      "de into en only\n")

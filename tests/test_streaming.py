"""Translating files chunk by chunk: order, bounded memory, resuming after an interruption."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError
from attnmt.streaming import chunks

WORDS = numbers_corpus("test", "de", "en", 999, {"train": 0, "valid": 0, "test": 300}, seed=9).source


def attnmt(*args, stdin=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "attnmt", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def test_chunks_cover_the_input_in_order():
    lines = [str(i) for i in range(7)]
    assert list(chunks(iter(lines), 3)) == [(0, ["0", "1", "2"]), (3, ["3", "4", "5"]), (6, ["6"])]


def recorded_lines(written: Path) -> int:
    """The input lines ``written``'s resume record counts as done (0 before it has one)."""
    try:
        return json.loads(written.with_name(written.name + ".resume.json").read_text())["lines"]
    except (OSError, ValueError, KeyError):
        return 0


def killed_once_written(command: list[str], written: Path) -> subprocess.Popen:
    """Run ``attnmt`` ``command`` and SIGKILL it once the first chunk of ``written`` (its
    first output) is recorded as done: the output alone may be on disk a moment before
    the record says so, and a kill then leaves nothing to resume."""
    process = subprocess.Popen([sys.executable, "-m", "attnmt", *command],
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if recorded_lines(written) > 0:
            break
        time.sleep(0.02)
    process.kill()                                          # SIGKILL; nothing if it has ended
    process.wait()
    return process


def test_translate_killed_and_resumed_ends_as_an_uninterrupted_run(tiny_runs, tmp_path):
    run, source = tiny_runs["transformer"], tmp_path / "in.de"
    lines = [WORDS[i % len(WORDS)] for i in range(5000)]
    source.write_text("".join(f"{line}\n" for line in lines))
    options = ["--beam", "1", "--threads", "1", "--n-best", "1"]
    whole = attnmt("translate", str(run), "-i", str(source), "-o", str(tmp_path / "whole.en"),
                   *options)
    assert whole.returncode == 0, whole.stderr
    assert not (tmp_path / "whole.en.resume.json").exists()         # finished: nothing to resume
    cut = tmp_path / "cut.en"
    command = ["translate", str(run), "-i", str(source), "-o", str(cut), *options]
    killed_once_written(command, cut)
    stopped = len(cut.read_text().splitlines())
    assert 0 < stopped < len(lines), "the kill came too early or too late"
    with open(cut, "a") as handle:
        handle.write("half a li")                      # what a kill inside a write leaves
    resumed = attnmt(*command, "--resume", "--progress")
    assert resumed.returncode == 0, resumed.stderr
    assert cut.read_text() == (tmp_path / "whole.en").read_text()
    assert "translate" in resumed.stderr and "5.00k/5.00k" in resumed.stderr   # the progress bar
    refused = attnmt("translate", str(run), "--resume", stdin="sieben\n")
    assert refused.returncode == 1 and "--resume needs -i FILE and -o FILE" in refused.stderr


def test_resume_refuses_other_settings_or_another_input(tiny_runs, tmp_path):
    # --n-best 2 counted output lines as inputs and skipped most of the rest; a changed input
    # of the same length resumed as if unchanged. Both are refused in one line, the output
    # left as it was.
    run, source = tiny_runs["transformer"], tmp_path / "in.de"
    lines = [WORDS[i % len(WORDS)] for i in range(5000)]
    source.write_text("".join(f"{line}\n" for line in lines))
    out = tmp_path / "out.en"
    command = ["translate", str(run), "-i", str(source), "-o", str(out), "--beam", "2",
               "--threads", "1"]
    killed_once_written(command, out)
    kept = out.read_bytes()
    other_settings = attnmt(*command, "--n-best", "2", "--resume")
    assert other_settings.returncode == 1
    assert other_settings.stderr.strip() == ("attnmt: error: cannot resume with other settings: "
                                             "n_best was 1, now 2; use the same settings, or "
                                             "translate again without --resume")
    swapped = [lines[1], lines[0], *lines[2:]]                       # same length, other text
    source.write_text("".join(f"{line}\n" for line in swapped))
    other_input = attnmt(*command, "--resume")
    assert other_input.returncode == 1
    assert "cannot resume: the first" in other_input.stderr and "are not those" in other_input.stderr
    assert out.read_bytes() == kept
    record = tmp_path / "out.en.resume.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "settings": []}))
    hand_edited = attnmt(*command, "--resume")                      # was an AttributeError
    assert hand_edited.returncode == 1 and hand_edited.stderr.strip() == (
        f"attnmt: error: cannot resume: {record} is not a resume record of attnmt")
    record.unlink()
    no_record = attnmt(*command, "--resume")
    assert no_record.returncode == 1 and "has no record of how it was made" in no_record.stderr
    assert out.read_bytes() == kept


def test_no_command_writes_over_its_input(tiny_runs, tmp_path):
    # `translate -i F -o F` exited 0 and left F empty.
    run, text = tiny_runs["transformer"], tmp_path / "text.de"
    text.write_text("sieben\nacht\n")
    (tmp_path / "link.de").symlink_to(text)
    for command in (["translate", str(run), "-i", str(text), "-o", str(text)],
                    ["translate", str(run), "-i", str(text), "-o", str(tmp_path / "link.de")],
                    ["synthesize", str(run), "-i", str(text), "-o", str(tmp_path / "text")]):
        refused = attnmt(*command)
        assert refused.returncode == 1, command
        assert "would destroy the input; choose another output" in refused.stderr, refused.stderr
        assert text.read_text() == "sieben\nacht\n"
    (tmp_path / "text.en").write_text("seven\n")                 # the output side named the input
    refused = attnmt("synthesize", str(run), "-i", str(tmp_path / "text.en"), "-o",
                     str(tmp_path / "text"))
    assert refused.returncode == 1 and "is the input" in refused.stderr
    assert (tmp_path / "text.en").read_text() == "seven\n"


def test_synthesize_killed_and_resumed_writes_aligned_pairs(tiny_runs, tmp_path):
    """A real interruption: SIGKILL once a chunk is on disk, then --resume; the pair files
    equal those of a run that was never stopped, line for line."""
    run, text = tiny_runs["transformer"], tmp_path / "mono.de"
    lines = [WORDS[i % len(WORDS)] if i % 97 else "" for i in range(7000)]    # empty lines too
    text.write_text("".join(f"{line}\n" for line in lines))
    reference = attnmt("synthesize", str(run), "-i", str(text), "-o", str(tmp_path / "ref"),
                       "--beam", "2", "--threads", "1")
    assert reference.returncode == 0, reference.stderr
    command = ["synthesize", str(run), "-i", str(text), "-o", str(tmp_path / "bt"), "--beam", "2",
               "--threads", "1"]
    written = tmp_path / "bt.en"
    killed_once_written(command, tmp_path / "bt.de")
    stopped = len(written.read_text().splitlines())
    assert 0 < stopped < len(lines), "the kill came too early or too late"
    resumed = attnmt(*command, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    for lang in ("de", "en"):
        assert (tmp_path / f"bt.{lang}").read_text() == (tmp_path / f"ref.{lang}").read_text()
    assert (tmp_path / "bt.de").read_text().splitlines() == lines
    assert f"{len(lines)} pairs" in resumed.stderr


def test_a_200000_line_input_streams_in_order_with_bounded_memory(tiny_runs, tmp_path):
    """Peak memory of 200,000 lines stays within 150 MB of that of 2,000 (one chunk): the
    input is never held whole, and the output comes in input order."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from attnmt.export import export_run

    run = export_run(tiny_runs["transformer"], tmp_path / "exported")
    small, large = tmp_path / "small.de", tmp_path / "large.de"
    small.write_text("".join(f"{WORDS[i % 20]}\n" for i in range(2000)))
    large.write_text("".join(f"{WORDS[i % 20]}\n" for i in range(200_000)))

    def peak_kb(path: Path) -> int:
        out = tmp_path / f"{path.stem}.en"
        probe = ("import resource, sys; from attnmt.cli import main; code = main(sys.argv[1:]); "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); "
                 "sys.exit(code)")
        result = subprocess.run([sys.executable, "-c", probe, "translate", str(run), "-i", str(path),
                                 "-o", str(out), "--beam", "1", "--threads", "2"], capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr
        return int(result.stderr.strip().splitlines()[-1])

    assert peak_kb(large) - peak_kb(small) < 150_000
    translated = (tmp_path / "large.en").read_text().splitlines()
    first = (tmp_path / "small.en").read_text().splitlines()[:20]
    assert len(translated) == 200_000 and translated[:20] == first
    assert all(translated[i] == first[i % 20] for i in range(0, 200_000, 997))


def test_back_translation_end_to_end(tiny_runs, tmp_path):
    """The tiny de->en run back-translates German text; an en->de model trains on real pairs
    plus those tagged synthetic ones; the tag is a piece of its vocabulary that translation
    never adds."""
    from attnmt.train import train
    from attnmt.translator import Translator

    from conftest import TINY

    (tmp_path / "mono.de").write_text("".join(f"{word}\n" for word in WORDS[:50]))
    made = attnmt("synthesize", str(tiny_runs["transformer"]), "-i", str(tmp_path / "mono.de"),
                  "-o", str(tmp_path / "bt"), "--beam", "2", "--threads", "1")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "bt.de").read_text() == (tmp_path / "mono.de").read_text()
    (tmp_path / "tiny.yaml").write_text(TINY)
    run = train(tmp_path / "tiny.yaml", tmp_path / "en_de",
                ["data.src_lang=en", "data.tgt_lang=de", f"data.synthetic=[{tmp_path / 'bt'}]",
                 "train.max_steps=5", "train.validate_every=5"])
    translator = Translator.from_run(run)
    tokenizer = translator.source_tokenizer
    assert tokenizer.encode_tagged_batch(["<bt> seven"]) == [[tokenizer.tag_ids["<bt>"],
                                                              *tokenizer.encode("seven")]]
    translation = translator.translate(["seven"])[0]
    assert "<bt>" not in translation.source_tokens
    typed = translator.translate(["<bt> seven"])[0]                   # typed by a user: text
    assert tokenizer.tag_ids["<bt>"] not in typed.source_ids and "<bt>" not in typed.source_tokens


def test_distillation_pairs_are_the_ensembles_translations_of_their_sources(tiny_runs, tmp_path):
    """An ensemble (two copies of a run) translates the training sources; every target line
    is the ensemble's translation of the source on the same line."""
    import shutil

    from attnmt.translator import Translator

    run, twin = tiny_runs["transformer"], tmp_path / "twin"
    shutil.copytree(run, twin)
    sources = WORDS[:40] + ["", "sieben"]
    (tmp_path / "train.de").write_text("".join(f"{line}\n" for line in sources))
    made = attnmt("synthesize", str(run), str(twin), "-i", str(tmp_path / "train.de"), "-o",
                  str(tmp_path / "distilled" / "train"), "--beam", "3", "--threads", "1")
    assert made.returncode == 0, made.stderr
    teacher = Translator.from_runs([run, twin])
    expected = [t.best.text for t in teacher.translate(sources, beam=3)]
    assert (tmp_path / "distilled" / "train.de").read_text().splitlines() == sources
    assert (tmp_path / "distilled" / "train.en").read_text().splitlines() == expected

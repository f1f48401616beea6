"""Translating files chunk by chunk: order, bounded memory, resuming after an interruption."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError
from attnmt.streaming import chunks, n_best_index, resume_position

WORDS = numbers_corpus("test", "de", "en", 999, {"train": 0, "valid": 0, "test": 300}, seed=9).source


def attnmt(*args, stdin=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "attnmt", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def test_chunks_cover_the_input_in_order():
    lines = [str(i) for i in range(7)]
    assert list(chunks(iter(lines), 3)) == [(0, ["0", "1", "2"]), (3, ["3", "4", "5"]), (6, ["6"])]


def test_resume_position_drops_a_cut_line_and_an_unfinished_n_best_group(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"one\ntwo\nthr")
    assert resume_position(plain) == 2 and plain.read_bytes() == b"one\ntwo\n"
    nbest = tmp_path / "nbest.txt"
    nbest.write_bytes(b"0 ||| a ||| -1\n0 ||| b ||| -2\n1 ||| c ||| -1\n2 ||| d ||| -1\n2 ||| e")
    assert resume_position(nbest, n_best_index) == 2
    assert nbest.read_bytes() == b"0 ||| a ||| -1\n0 ||| b ||| -2\n1 ||| c ||| -1\n"
    assert resume_position(tmp_path / "absent.txt") == 0
    (tmp_path / "foreign.txt").write_text("not n-best\n")
    with pytest.raises(UserError, match="is not a line of n-best output"):
        resume_position(tmp_path / "foreign.txt", n_best_index)


def test_translate_resumes_to_the_same_file(tiny_runs, tmp_path):
    run, source = tiny_runs["transformer"], tmp_path / "in.de"
    source.write_text("".join(f"{word}\n" for word in WORDS * 2))
    whole = attnmt("translate", str(run), "-i", str(source), "-o", str(tmp_path / "whole.en"),
                   "--threads", "1")
    assert whole.returncode == 0, whole.stderr
    expected = (tmp_path / "whole.en").read_text()
    assert len(expected.splitlines()) == 2 * len(WORDS)
    cut = tmp_path / "cut.en"
    cut.write_text(expected[:len(expected) // 3] + "half a li")        # as a kill leaves it
    resumed = attnmt("translate", str(run), "-i", str(source), "-o", str(cut), "--threads", "1",
                     "--resume", "--progress")
    assert resumed.returncode == 0, resumed.stderr
    assert cut.read_text() == expected
    assert "translate" in resumed.stderr and "600/600" in resumed.stderr    # the progress bar
    refused = attnmt("translate", str(run), "--resume", stdin="sieben\n")
    assert refused.returncode == 1 and "--resume needs -i FILE and -o FILE" in refused.stderr


def test_synthesize_killed_and_resumed_writes_aligned_pairs(tiny_runs, tmp_path):
    """A real interruption: SIGKILL once a chunk is on disk, then --resume; the pair files
    equal those of a run that was never stopped, line for line."""
    run, text = tiny_runs["transformer"], tmp_path / "mono.de"
    lines = [WORDS[i % len(WORDS)] if i % 97 else "" for i in range(7000)]    # empty lines too
    text.write_text("".join(f"{line}\n" for line in lines))
    reference = attnmt("synthesize", str(run), "-i", str(text), "-o", str(tmp_path / "ref"),
                       "--beam", "2", "--threads", "1")
    assert reference.returncode == 0, reference.stderr
    command = [sys.executable, "-m", "attnmt", "synthesize", str(run), "-i", str(text), "-o",
               str(tmp_path / "bt"), "--beam", "2", "--threads", "1"]
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    written = tmp_path / "bt.en"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if written.is_file() and written.stat().st_size > 0:
            break
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    stopped = len(written.read_text().splitlines())
    assert 0 < stopped < len(lines), "the kill came too early or too late"
    resumed = attnmt("synthesize", *command[4:], "--resume")
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
    assert translator.source_tokenizer.pieces("<bt> seven") == ["<bt>", *translator.source_tokenizer.pieces("seven")]
    translation = translator.translate(["seven"])[0]
    assert "<bt>" not in translation.source_tokens


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

import subprocess
import sys

import pytest
import torch

from attnmt.errors import UserError
from attnmt.translator import Translator, hard_alignment


@pytest.fixture(scope="module")
def run(tiny_runs):
    return tiny_runs["transformer"]


def attnmt(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "attnmt", *args], input=stdin,
                          capture_output=True, timeout=120)


def test_translations_keep_input_order_and_handle_empty_text(run):
    translator = Translator.from_run(run)
    texts = ["dreihundertzwölf", "", "sieben", "   ", "neunhundertneunundneunzig"]
    translations = translator.translate(texts, beam=3, n_best=2)
    assert [t.source for t in translations] == texts
    assert translations[1].best.text == "" and translations[3].best.tokens == []
    assert all(len(t.hypotheses) == 2 for t in (translations[0], translations[2]))
    alone = translator.translate([texts[4]], beam=3)[0]
    assert alone.best.text == translations[4].best.text


def test_translator_refuses_bad_requests(run):
    translator = Translator.from_run(run)
    with pytest.raises(UserError, match=r"n-best \(3\) must be between 1 and the beam size \(2\)"):
        translator.translate(["sieben"], beam=2, n_best=3)
    with pytest.raises(UserError, match="input 2 has .* tokens; this model accepts at most 39"):
        translator.translate(["sieben", "sieben " * 60])


def test_translator_refuses_emulated_bf16(run, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with pytest.raises(UserError, match="^precision: bf16 is not supported on this cpu; use fp32$"):
        Translator.from_run(run, precision="bf16")


def test_translator_refuses_unknown_precision(run):
    with pytest.raises(UserError, match="^precision must be one of auto, fp32, bf16, fp16; got 'fp8'$"):
        Translator.from_run(run, precision="fp8")


def test_alignment_pairs_are_word_indices(run):
    translator = Translator.from_run(run)
    translation = translator.translate(["dreihundertzwölf"], beam=2, need_attention=True)[0]
    pairs = hard_alignment(translation, translation.best, translator.source_tokenizer,
                           translator.target_tokenizer)
    target_words = len(translation.best.text.split())
    assert pairs and all(i == 0 and 0 <= j < max(target_words, 1) for i, j in pairs)


def test_cli_translate_plain_nbest_and_alignment(run):
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


def test_cli_translate_bad_utf8_is_one_line(run):
    result = attnmt("translate", str(run), "--threads", "1", stdin=b"sieben\n\xff\xfe\n")
    assert result.returncode == 1
    assert result.stderr.decode().strip() == "attnmt: error: standard input: line 2 is not valid UTF-8"
    assert b"Traceback" not in result.stderr


def test_cli_evaluate_prints_scores_and_buckets(run, tmp_path):
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


def test_cli_refuses_missing_run_and_corrupt_checkpoint(run, tmp_path):
    missing = attnmt("translate", str(tmp_path / "nowhere"), stdin=b"x\n")
    assert missing.returncode == 1 and b"is not an attnmt run directory" in missing.stderr
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 64)
    corrupt = attnmt("translate", str(run), "--checkpoint", str(broken), stdin=b"x\n")
    assert corrupt.returncode == 1
    assert corrupt.stderr.decode().strip() == (f"attnmt: error: {broken} is not a valid checkpoint "
                                               f"for this model ({corrupt.stderr.decode().split('(', 1)[1].strip()}")


def test_cli_missing_input_file_is_one_line(run, tmp_path):
    result = attnmt("translate", str(run), "-i", str(tmp_path / "absent.txt"))
    assert result.returncode == 1
    assert result.stderr.decode().strip() == (f"attnmt: error: No such file or directory: "
                                              f"{tmp_path / 'absent.txt'}")

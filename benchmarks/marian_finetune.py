"""A base-size MarianMT model (OPUS-MT's shape) imported and fine-tuned on a CPU.

    python benchmarks/marian_finetune.py --data-dir DATA [--work DIR] [--steps 40]

No model hub is reachable, so the MarianMT folder is made here with transformers: OPUS-MT's
base shape (6+6 layers, d_model 512, 8 heads, FFN 2048, swish, one vocabulary of 58,101
entries, about 74M parameters), random weights; speed and memory do not depend on the
weights. It prints:

* the seconds ``attnmt import`` takes (target: under 10 s);
* target tokens/s of fine-tuning the import on Multi30k de->en with ``--init-from``, and of
  attnmt's own Transformer of the same shape trained the same way (ReLU, interleaved
  sinusoids, the same vocabulary), measured one after the other in this run, after the
  first ``--warmup`` updates (target: the import at least 0.8x);
* each training's peak resident memory (target: the import within 4 GB).

Precision is the config's ``auto``: bf16 where the CPU has native bf16, else fp32.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_base_marian(folder: Path, data_dir: Path) -> None:
    """OPUS-MT's base shape with SentencePiece models of Multi30k and a 58,101-entry vocabulary
    (the pieces, then filler entries up to OPUS-MT de-en's size)."""
    import gzip
    import io

    import sentencepiece as spm
    import torch
    import transformers

    folder.mkdir(parents=True)
    for side, lang in (("source", "de"), ("target", "en")):
        lines = gzip.open(data_dir / f"train.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=8000,
                                       hard_vocab_limit=False,
                                       model_type="unigram", bos_id=-1, eos_id=1, unk_id=2, pad_id=-1,
                                       minloglevel=2)
        (folder / f"{side}.spm").write_bytes(model.getvalue())
    tokens = ["</s>", "<unk>"]
    for side in ("source", "target"):
        processor = spm.SentencePieceProcessor(model_file=str(folder / f"{side}.spm"))
        tokens += [p for p in (processor.id_to_piece(i) for i in range(processor.get_piece_size()))
                   if p not in tokens]
    tokens += [f"<filler_{i}>" for i in range(58100 - len(tokens))] + ["<pad>"]
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(tokens)}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en"}))
    config = transformers.MarianConfig(
        vocab_size=len(tokens), decoder_vocab_size=len(tokens), d_model=512, encoder_layers=6,
        decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, activation_function="swish", max_position_embeddings=512,
        pad_token_id=len(tokens) - 1, eos_token_id=0, decoder_start_token_id=len(tokens) - 1,
        forced_eos_token_id=0, scale_embedding=True, share_encoder_decoder_embeddings=True)
    torch.manual_seed(0)
    transformers.MarianMTModel(config).save_pretrained(folder)


def plain_corpus(data_dir: Path, folder: Path) -> Path:
    """Multi30k's training pairs and the first 100 validation pairs, as plain files."""
    import gzip

    folder.mkdir(exist_ok=True)
    for lang in ("de", "en"):
        train = gzip.open(data_dir / f"train.{lang}.gz", "rt", encoding="utf-8").read()
        valid = gzip.open(data_dir / f"val.{lang}.gz", "rt", encoding="utf-8").read().splitlines()[:100]
        (folder / f"train.{lang}").write_text(train, encoding="utf-8")
        (folder / f"valid.{lang}").write_text("\n".join(valid) + "\n", encoding="utf-8")
    return folder


def timed_import(folder: Path, run: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "attnmt", "import", str(folder), "--run-dir", str(run)],
                            capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode:
        sys.exit(result.stderr)
    return seconds


def train(config: Path, run: Path, settings: list[str]) -> float:
    """Train in a child process; its own peak resident memory in MB (``wait4``'s usage)."""
    options = [argument for setting in settings for argument in ("--set", setting)]
    child = subprocess.Popen([sys.executable, "-m", "attnmt", "train", str(config), "--run-dir", str(run),
                              *options], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    errors = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    if status:
        sys.exit(errors[-2000:])
    return usage.ru_maxrss / 1024


def tokens_per_second(run: Path, warmup: int) -> float:
    rows = [row for row in csv.DictReader((run / "log.csv").open()) if row["tokens_per_s"]]
    late = [float(row["tokens_per_s"]) for row in rows if int(row["step"]) > warmup]
    return sum(late) / len(late)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="Multi30k's folder")
    parser.add_argument("--work", type=Path, default=Path("runs/marian_benchmark"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10, help="updates left out of tokens/s")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    folder = args.work / "marian_base"
    if not folder.is_dir():
        build_base_marian(folder, args.data_dir)
    imported, tuned, native = args.work / "imported", args.work / "tuned", args.work / "native"
    for run in (imported, tuned, native):                 # every figure from this run
        shutil.rmtree(run, ignore_errors=True)
    seconds = timed_import(folder, imported)
    corpus = plain_corpus(args.data_dir, args.work / "multi30k")
    common = ["data.dataset=files", f"data.train={corpus}/train", f"data.valid={corpus}/valid",
              f"train.max_steps={args.steps}", "train.max_minutes=0", "train.log_every=5",
              f"train.validate_every={args.steps}", "train.warmup=10"]
    tuned_mb = train(imported / "config.yaml", tuned, common + [f"train.init_from={imported}"])
    native_mb = train(imported / "config.yaml", native, common + [
        f"data.tokenizer_from={imported}", "model.activation=relu", "model.position_layout=interleaved",
        "model.marian_special_tokens=false"])
    tuned_speed, native_speed = tokens_per_second(tuned, args.warmup), tokens_per_second(native, args.warmup)
    import torch

    from attnmt.process import resolve_precision
    precision = resolve_precision("auto", torch.device("cpu")) or "fp32"
    print(f"machine: {platform.machine()}, PyTorch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"precision {precision}")
    print(f"import of a base-size MarianMT model: {seconds:.1f} s")
    print(f"fine-tuning the import: {tuned_speed:,.0f} target tokens/s, peak {tuned_mb:,.0f} MB")
    print(f"attnmt's Transformer of the same shape: {native_speed:,.0f} target tokens/s, peak {native_mb:,.0f} MB")
    print(f"ratio: {tuned_speed / native_speed:.2f}")


if __name__ == "__main__":
    main()

"""MarianMT in and out (attnmt/marian.py), against transformers itself.

No model hub is reachable: each test builds small MarianMT models with transformers
(random weights, SentencePiece models trained on number words), in every variant an
OPUS-MT model comes in (swish, relu or gelu; one vocabulary or two).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import yaml

transformers = pytest.importorskip("transformers", reason="the [hf] extra: pip install -e '.[hf]'")

from attnmt.data import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from attnmt.data.numbers import number_words  # noqa: E402
from attnmt.masks import padding_mask, target_mask  # noqa: E402
from attnmt.run import RunDirectory  # noqa: E402
from attnmt.translator import Translator  # noqa: E402

from test_train import assert_resume_after_sigkill_is_exact  # noqa: E402

SENTENCES = [f"{number_words(n, 'de')} ." for n in (24, 312, 9000, 7, 80, 1234, 55, 606, 13, 4711)]
STEPS, LR = 300, 0.01
LIMIT = 30                                    # output tokens, EOS counted, on both sides
VARIANTS = [(activation, shared) for activation in ("swish", "relu", "gelu") for shared in (True, False)]


def variant_id(variant):
    return f"{variant[0]}-{'shared' if variant[1] else 'separate'}"


def _spm(lines: list[str], size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=size,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   bos_id=-1, eos_id=1, unk_id=2, pad_id=-1, minloglevel=2)
    return model.getvalue()


def _vocabulary(*models: bytes) -> dict[str, int]:
    """MarianMT's layout: </s> 0, <unk> 1, the pieces, <pad> last."""
    tokens = ["</s>", "<unk>"]
    for model in models:
        processor = spm.SentencePieceProcessor(model_proto=model)
        tokens += [piece for piece in (processor.id_to_piece(i) for i in range(processor.get_piece_size()))
                   if piece not in tokens and piece not in ("<s>",)]
    return {token: index for index, token in enumerate(tokens + ["<pad>"])}


def _train_briefly(model, folder: Path, seed: int) -> None:
    """A few dozen updates on number words in transformers, so that outputs differ and end;
    then MarianMT's <pad> row is zeroed, as in OPUS-MT's models (its decoder starts from zeros)."""
    separate = (folder / "target_vocab.json").is_file()
    tokenizer = transformers.MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                                             str(folder / "vocab.json"), separate_vocabs=separate,
                                             target_vocab_file=str(folder / "target_vocab.json")
                                             if separate else None)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    for _ in range(STEPS):
        numbers = torch.randint(0, 999, (16,), generator=generator).tolist()
        batch = tokenizer([number_words(n, "de") + " ." for n in numbers],
                          text_target=[number_words(n, "en") + " ." for n in numbers],
                          return_tensors="pt", padding=True)
        labels = batch["labels"]             # padded with the source vocabulary's <pad> id
        labels[(labels == tokenizer.pad_token_id) | (labels == model.config.pad_token_id)] = -100
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        for embedding in {id(e.weight): e.weight for e in (model.get_encoder().embed_tokens,
                                                          model.get_decoder().embed_tokens)}.values():
            embedding[model.config.pad_token_id] = 0


def build_marian(folder: Path, activation: str = "swish", shared: bool = True, seed: int = 0,
                 trained: bool = True) -> Path:
    """A small MarianMT folder as transformers saves it: random weights and output bias,
    trained briefly."""
    folder.mkdir(parents=True)
    numbers = range(0, 9999, 23)
    source = _spm([number_words(n, "de") + " ." for n in numbers], 60)
    target = _spm([number_words(n, "en") + " ." for n in numbers], 50)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    vocabulary = _vocabulary(source, target) if shared else _vocabulary(source)
    target_vocabulary = vocabulary if shared else _vocabulary(target)
    (folder / "vocab.json").write_text(json.dumps(vocabulary))
    if not shared:
        (folder / "target_vocab.json").write_text(json.dumps(target_vocabulary))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "de", "target_lang": "en", "separate_vocabs": not shared}))
    pad = len(target_vocabulary) - 1
    config = transformers.MarianConfig(
        vocab_size=len(vocabulary), decoder_vocab_size=len(target_vocabulary), d_model=16,
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, activation_function=activation,
        max_position_embeddings=64, pad_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        decoder_start_token_id=pad, scale_embedding=True, share_encoder_decoder_embeddings=shared,
        init_std=0.3, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)
    threads = torch.get_num_threads()      # what earlier tests left: the sums of 1 thread and
    torch.set_num_threads(2)               # of 2 differ, and 300 updates make that another model
    try:                                   # (relu, shared: one output for every source with 1)
        torch.manual_seed(seed)
        model = transformers.MarianMTModel(config)
        with torch.no_grad():
            model.final_logits_bias.normal_(0, 0.5)
        if trained:
            _train_briefly(model, folder, seed)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(folder)
    return folder


def import_run(folder: Path, run: Path) -> Path:
    from attnmt.marian import import_marian

    import_marian(folder, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["decode"].update(max_len_a=0.0, max_len_b=LIMIT)        # transformers' max_new_tokens
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


@pytest.fixture(scope="module")
def marian_folders(tmp_path_factory):
    """Each variant's MarianMT folder, built once, on first use."""
    built = {}

    def folder(variant):
        if variant not in built:
            built[variant] = build_marian(tmp_path_factory.mktemp(variant_id(variant)) / "model", *variant)
        return built[variant]
    return folder


@pytest.fixture(scope="module", params=VARIANTS, ids=variant_id)
def imported(request, marian_folders):
    folder = marian_folders(request.param)
    run = folder.parent / "run"
    return folder, run if run.is_dir() else import_run(folder, run)


def hugging_face(folder: Path):
    return (transformers.MarianMTModel.from_pretrained(folder).eval(),
            transformers.MarianTokenizer.from_pretrained(folder))


def generated(model, tokenizer, beam: int, bad_words: bool) -> list[str]:
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    extra = {"bad_words_ids": [[model.config.pad_token_id]]} if bad_words else {}
    output = model.generate(**batch, num_beams=beam, max_new_tokens=LIMIT, length_penalty=0.0,
                            do_sample=False, **extra)
    # each row up to its </s>, without the start token: with two vocabularies MarianTokenizer
    # takes the target <pad> for a word (it knows the source vocabulary's)
    rows = [row[1:].tolist() for row in output]
    eos = model.config.eos_token_id
    return tokenizer.batch_decode([row[:row.index(eos)] if eos in row else row for row in rows],
                                  skip_special_tokens=True)


def source_batch(tokenizer, sentences=SENTENCES):
    ids = [tokenizer.encode(sentence) + [EOS_ID] for sentence in sentences]
    width = max(map(len, ids))
    src = torch.tensor([row + [PAD_ID] * (width - len(row)) for row in ids])
    return ids, src, padding_mask(src, PAD_ID)


def side_by_side(folder: Path, run: Path):
    """transformers' model and batch of SENTENCES, attnmt's model and tokenizers and batch of
    them; the source ids checked to be the same (through an import's reordering)."""
    theirs, tokenizer = hugging_face(folder)
    _, source, target, model = RunDirectory(run).load_model()
    ids, src, src_mask = source_batch(source)
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    in_marian_ids = (lambda i: source.marian_ids[i]) if source.kind == "marian" else (lambda i: i)
    for ours, reference, mask in zip(ids, batch["input_ids"], batch["attention_mask"]):
        assert [in_marian_ids(i) for i in ours] == reference[mask.bool()].tolist()
    return theirs, batch, model.eval(), source, target, src, src_mask


def test_imported_logits_equal_transformers(imported):
    folder, run = imported
    theirs, batch, model, source, target, src, src_mask = side_by_side(folder, run)
    generator = torch.Generator().manual_seed(1)
    marian_targets = torch.randint(0, len(target.vocabulary) - 1, (len(SENTENCES), 9), generator=generator)
    ours_of = {marian: ours for ours, marian in enumerate(target.marian_ids) if marian is not None}
    tgt = torch.tensor([[BOS_ID] + [ours_of[int(t)] for t in row] for row in marian_targets])
    start = torch.full((len(SENTENCES), 1), theirs.config.decoder_start_token_id)
    with torch.no_grad():
        reference = theirs(**batch, decoder_input_ids=torch.cat([start, marian_targets], 1)).logits
        logits = model(src, src_mask, tgt, target_mask(tgt, PAD_ID))
    in_marian_order = torch.tensor([ours_of[m] for m in range(len(target.vocabulary))])
    torch.testing.assert_close(logits[:, :, in_marian_order], reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_imported_translations_equal_generate(imported, beam):
    folder, run = imported
    theirs, tokenizer = hugging_face(folder)
    reference = generated(theirs, tokenizer, beam, bad_words=True)
    ours = [translation.best.text for translation in
            Translator.from_run(run).translate(SENTENCES, beam=beam, alpha=0.0)]
    assert ours == reference
    assert len(set(ours)) >= 2                   # the outputs depend on the source


@pytest.mark.parametrize("variant", [("swish", True), ("gelu", True)], ids=variant_id)
def test_the_ctranslate2_export_translates_as_ctranslate2s_own_converter(tmp_path, marian_folders, variant):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from attnmt.export import export_run

    folder = marian_folders(variant)
    run = import_run(folder, tmp_path / "run")
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    source_pieces = {index: piece for piece, index in tokenizer.encoder.items()}    # the source vocabulary
    pieces = [[source_pieces[i] for i in tokenizer(s)["input_ids"]] for s in SENTENCES]
    for quantization in ("float32", "int8"):
        converted = tmp_path / f"converted_{quantization}"
        ctranslate2.converters.TransformersConverter(str(folder)).convert(str(converted),
                                                                         quantization=quantization)
        engine = ctranslate2.Translator(str(converted))
        ours = Translator.from_run(export_run(run, tmp_path / f"export_{quantization}", quantization))
        for beam in (1, 4):
            results = engine.translate_batch(pieces, beam_size=beam, max_decoding_length=LIMIT - 1,
                                             min_decoding_length=0, length_penalty=0.0)
            reference = [tokenizer.convert_tokens_to_string(result.hypotheses[0]) for result in results]
            assert [t.best.text for t in ours.translate(SENTENCES, beam=beam, alpha=0.0)] == reference, \
                (quantization, beam)


def test_a_two_vocabulary_model_exports_to_ctranslate2_and_translates_as_pytorch(tmp_path, marian_folders):
    """CTranslate2's own converter takes one vocabulary for both sides of a MarianMT model (it
    refuses this one); attnmt's export writes each side's."""
    pytest.importorskip("ctranslate2")
    from attnmt.export import export_run

    run = import_run(marian_folders(("relu", False)), tmp_path / "run")
    exported = Translator.from_run(export_run(run, tmp_path / "export", "float32"))
    for beam in (1, 4):
        assert [t.best.text for t in exported.translate(SENTENCES, beam=beam, alpha=0.0)] == \
            [t.best.text for t in Translator.from_run(run).translate(SENTENCES, beam=beam, alpha=0.0)]


def test_a_start_row_that_is_not_zero_is_kept_and_never_output(tmp_path, marian_folders):
    """A MarianMT model fine-tuned in transformers may have moved its <pad> row (the tied
    output projection's gradient reaches it): the CTranslate2 export keeps that row as the
    decoder's start instead of starting from zeros, and tells the engine never to output it."""
    pytest.importorskip("ctranslate2")
    import shutil

    from safetensors.torch import load_file, save_file

    from attnmt.export import export_run

    folder = tmp_path / "model"
    shutil.copytree(marian_folders(("swish", True)), folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.shared.weight"][json.loads((folder / "config.json").read_text())["pad_token_id"]] += 0.5
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    run = import_run(folder, tmp_path / "run")
    exported = export_run(run, tmp_path / "export", "float32")
    assert json.loads((exported / "export.json").read_text())["never_output"] == ["<pad>"]
    for beam in (1, 4):
        assert [t.best.text for t in Translator.from_run(exported).translate(SENTENCES, beam=beam, alpha=0.0)] \
            == [t.best.text for t in Translator.from_run(run).translate(SENTENCES, beam=beam, alpha=0.0)]


def test_an_imported_model_exported_to_transformers_is_the_same_model(imported, tmp_path):
    from attnmt.marian import export_transformers

    folder, run = imported
    written = export_transformers(run, tmp_path / "back")
    original, tokenizer = hugging_face(folder)
    again, again_tokenizer = hugging_face(written)
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    assert torch.equal(again_tokenizer(SENTENCES, return_tensors="pt", padding=True)["input_ids"],
                       batch["input_ids"])
    decoder_input = torch.randint(0, original.config.decoder_vocab_size - 1, (len(SENTENCES), 7))
    decoder_input[:, 0] = original.config.decoder_start_token_id
    with torch.no_grad():
        assert torch.equal(again(**batch, decoder_input_ids=decoder_input).logits,
                           original(**batch, decoder_input_ids=decoder_input).logits)
    assert generated(again, again_tokenizer, 4, bad_words=False) == generated(original, tokenizer, 4, True)


@pytest.fixture(scope="module")
def native_run(tmp_path_factory):
    """attnmt's own tiny Transformer (interleaved sinusoids, ReLU, <s> as start)."""
    from attnmt.train import train
    from conftest import TINY

    folder = tmp_path_factory.mktemp("native")
    (folder / "tiny.yaml").write_text(TINY)
    return train(folder / "tiny.yaml", folder / "run", ["train.max_steps=80", "train.validate_every=80",
                                                        "data.joint_vocab=true", "model.tie_embeddings=all"])


def test_an_attnmt_run_exported_to_transformers_translates_as_attnmt_does(native_run, tmp_path):
    from attnmt.marian import export_transformers

    written = export_transformers(native_run, tmp_path / "hf")
    theirs, batch, model, source, _, src, src_mask = side_by_side(written, native_run)
    tokenizer = transformers.MarianTokenizer.from_pretrained(written)
    tgt = torch.randint(4, source.vocab_size, (len(SENTENCES), 8))
    tgt[:, 0] = BOS_ID
    with torch.no_grad():     # the model dimension permuted: sums in another order, same values
        torch.testing.assert_close(theirs(**batch, decoder_input_ids=tgt).logits,
                                   model(src, src_mask, tgt, target_mask(tgt, PAD_ID)), rtol=0, atol=1e-5)
    translator = Translator.from_run(native_run)
    for beam in (1, 4):
        ours = [t.best.text for t in translator.translate(SENTENCES, beam=beam, alpha=0.0)]
        assert generated(theirs, tokenizer, beam, bad_words=False) == ours


def test_an_imported_model_exported_and_imported_again_gives_identical_logits(imported, tmp_path):
    from attnmt.marian import export_transformers, import_marian

    folder, run = imported
    again = import_marian(export_transformers(run, tmp_path / "hf"), tmp_path / "again")
    models = [RunDirectory(path).load_model()[3].eval() for path in (run, again)]
    _, src, src_mask = source_batch(RunDirectory(run).load_model()[1])
    tgt = torch.randint(4, 40, (len(SENTENCES), 6))
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        first, second = (model(src, src_mask, tgt, target_mask(tgt, PAD_ID)) for model in models)
    assert torch.equal(first, second)


def fine_tuning_config(run: Path, path: Path) -> Path:
    """The imported run's config, on number words, sized like the tests' tiny config."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"].update(dataset="numbers", numbers_max=999, numbers_train=600, numbers_valid=40,
                          numbers_test=40)
    config["train"].update(lr=0.003, warmup=20, batch_tokens=400, max_steps=200, max_minutes=0,
                           validate_every=50, log_every=1, threads=1, precision="fp32", device="cpu",
                           keep_checkpoints=5, schedule="linear")
    path.write_text(yaml.safe_dump(config))
    return path


def test_fine_tuning_an_imported_model_lowers_its_loss_and_resumes_exactly(tmp_path, marian_folders):
    from attnmt.config import load_config
    from attnmt.train import train

    run = import_run(marian_folders(("swish", True)), tmp_path / "imported")
    config = fine_tuning_config(run, tmp_path / "tune.yaml")
    tuned = train(config, tmp_path / "tuned", [f"train.init_from={run}", "train.max_steps=60",
                                              "train.validate_every=10"])
    losses = [float(row["valid_loss"]) for row in RunDirectory(tuned).read_log() if row["valid_loss"]]
    assert losses[-1] < 0.8 * losses[0], losses
    model = RunDirectory(tuned).load_model()[3]
    embedding = model.decoder.embedding.weight
    assert not embedding[BOS_ID].any() and not embedding[PAD_ID].any()   # the start row stays zero
    assert load_config(tuned / "config.yaml").data.tokenizer_from == str(run)
    ensemble = Translator.from_runs([run, tuned])          # runs sharing the import's vocabulary
    assert [t.best.text for t in ensemble.translate(SENTENCES[:3])] != ["", "", ""]
    assert_serves_its_attention(run)
    assert_resume_after_sigkill_is_exact(config, tmp_path / "resume", [f"train.init_from={run}"])


def assert_serves_its_attention(run: Path) -> None:
    from fastapi.testclient import TestClient

    from attnmt.serve import create_app

    with TestClient(create_app(Translator.from_run(run))) as client:
        answer = client.post("/translate", json={"text": SENTENCES[0], "attention": True})
    assert answer.status_code == 200, answer.text
    grid = answer.json()["translations"][0]["hypotheses"][0]["attention"]
    assert (len(grid), len(grid[0])) == (2, 2)           # decoder layers x heads of the import


def attnmt(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnmt", *arguments], capture_output=True, text=True,
                          timeout=300)


def edited_folder(tmp_path: Path, edit) -> Path:
    folder = build_marian(tmp_path / "model", trained=False)
    config = json.loads((folder / "config.json").read_text())
    edit(config, folder)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("edit, message", [
    (lambda c, f: c.update(model_type="bart"), "not a MarianMT model: config.json has model_type 'bart'"),
    (lambda c, f: c.update(scale_embedding=False), "config.json: scale_embedding false"),
    (lambda c, f: c.update(decoder_ffn_dim=64), "config.json: encoder_ffn_dim 32 and decoder_ffn_dim 64 differ"),
    (lambda c, f: c.update(activation_function="gelu_new"), "config.json: activation_function 'gelu_new'"),
    (lambda c, f: c.update(normalize_before=True), "config.json: normalize_before true"),
    (lambda c, f: c.update(decoder_start_token_id=0), "config.json: decoder_start_token_id 0 is not the target"),
    (lambda c, f: (f / "vocab.json").unlink(), "is not a MarianMT folder: no vocab.json"),
    (lambda c, f: (f / "model.safetensors").write_bytes(b"\x00" * 10), "model.safetensors cannot be read"),
    (lambda c, f: c.update(encoder_layers="two"), "config.json: "),
    (lambda c, f: c.update(d_model=32), "the MarianMT weights do not fit its config.json (size mismatch"),
    (lambda c, f: (f / "tokenizer_config.json").write_text("[]"), "tokenizer_config.json is not a JSON object"),
], ids=["bart", "unscaled", "ffn", "gelu_new", "pre-norm", "start", "no-vocabulary", "corrupt", "type",
        "shapes", "not-an-object"])
def test_what_attnmt_cannot_import_is_refused_in_one_line(tmp_path, edit, message):
    folder = edited_folder(tmp_path, edit)
    result = attnmt("import", str(folder), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 1
    assert result.stderr.startswith("attnmt: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("setting, message", [
    ("model.norm=pre", "model.norm pre: MarianMT's blocks are post-norm"),
    ("model.positions=learned", "model.positions learned"),
    ("data.synthetic_tag=<bt>", None),
])
def test_runs_marian_cannot_express_are_refused_in_one_line(tmp_path, setting, message):
    from attnmt.train import train
    from conftest import TINY

    (tmp_path / "tiny.yaml").write_text(TINY)
    overrides = ["train.max_steps=2", "train.validate_every=2", setting]
    if message is None:                  # a vocabulary with tags (<2de>, <bt>) MarianTokenizer cuts up
        overrides[-1] = "data.extra_tgt_langs=[fr]"
        message = "the tags <2en>, <2fr>"
    run = train(tmp_path / "tiny.yaml", tmp_path / "run", overrides)
    result = attnmt("export", str(run), str(tmp_path / "hf"), "--format", "transformers")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr and not (tmp_path / "hf").exists()

"""MarianMT models in and out: ``attnmt import`` and ``attnmt export --format transformers``.

A MarianMT folder (Hugging Face transformers' format of the Marian models, OPUS-MT's among
them) holds ``config.json``, the weights (``model.safetensors``, or ``pytorch_model.bin``
read with ``weights_only``), ``source.spm`` and ``target.spm`` and ``vocab.json`` (with
``target_vocab.json`` for a model with two vocabularies). Its network is attnmt's
Transformer with three settings (``model.activation``, ``model.position_layout: halves``,
``model.marian_special_tokens``) and its vocabulary a :class:`MarianVocabularyTokenizer`;
the weights map name for name::

    MarianMT                                   attnmt
    model.shared / model.{en,de}coder.embed_tokens   {en,de}coder.embedder.tokens (rows reordered)
    lm_head (tied) + final_logits_bias         generator.weight, generator.bias
    ...layers.N.self_attn.{q,k,v,out}_proj     ...layers.N.self_attn.{q,k,v,out}_proj
    ...layers.N.encoder_attn.*                 decoder.layers.N.cross_attn.*
    ...self_attn_layer_norm                    attn_norm.norm (encoder), self_norm.norm (decoder)
    ...encoder_attn_layer_norm                 decoder.layers.N.cross_norm.norm
    ...fc1, fc2, final_layer_norm              ffn.net.0, ffn.net.3, ffn_norm.norm

The rows are reordered because attnmt's special ids are fixed (pad 0, ``<s>`` 1, ``</s>`` 2,
``<unk>`` 3): MarianMT's ``<pad>``, which starts its decoder, becomes ``<s>``, and row 0 is a
row MarianMT does not have, left out of the softmax. Exporting writes the reverse; an
attnmt run is written through a permutation of the model dimension that turns its
interleaved sinusoids into MarianMT's ``[sin | cos]`` halves (LayerNorm, attention and the
FFN do not depend on the order of that dimension), so every preset exports.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

from attnmt.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig, save_config
from attnmt.data import BOS_ID, EOS_ID, PAD_ID
from attnmt.data.tokenizers import MarianVocabularyTokenizer, save_tokenizers
from attnmt.errors import UserError
from attnmt.export_weights import VOCABULARY_ROWS
from attnmt.run import (MADE_BY_ATTNMT, RunDirectory, fresh_temporary, mark_made,
                        refuse_destination_holding, replace_folder)

MARIAN_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}   # theirs: ours
# The modules of a layer, attnmt's name -> MarianMT's (the tensors' suffixes are the same).
LAYER_MODULES = {
    "encoder": {"self_attn": "self_attn", "attn_norm.norm": "self_attn_layer_norm",
                "ffn.net.0": "fc1", "ffn.net.3": "fc2", "ffn_norm.norm": "final_layer_norm"},
    "decoder": {"self_attn": "self_attn", "self_norm.norm": "self_attn_layer_norm",
                "cross_attn": "encoder_attn", "cross_norm.norm": "encoder_attn_layer_norm",
                "ffn.net.0": "fc1", "ffn.net.3": "fc2", "ffn_norm.norm": "final_layer_norm"}}


# --- reading a MarianMT folder -------------------------------------------------------------

def read_json(path: Path, optional: bool = False) -> dict:
    """The JSON object in ``path``; ``{}`` for an absent optional file."""
    if optional and not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path.parent} is not a MarianMT folder: no {path.name}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(found, dict):
        raise UserError(f"{path} is not a JSON object")
    return found


def marian_settings(config: dict) -> ModelConfig:
    """attnmt's model settings for a MarianMT ``config.json``; what attnmt's Transformer
    cannot compute is refused in one line naming the setting."""
    if config.get("model_type") != "marian":
        raise UserError(f"not a MarianMT model: config.json has model_type {config.get('model_type')!r} "
                        "(attnmt imports 'marian')")
    for attnmt_name, names in (("heads", ("encoder_attention_heads", "decoder_attention_heads")),
                               ("ffn_dim", ("encoder_ffn_dim", "decoder_ffn_dim"))):
        if config.get(names[0]) != config.get(names[1]):
            raise UserError(f"config.json: {names[0]} {config.get(names[0])} and {names[1]} "
                            f"{config.get(names[1])} differ; attnmt has one model.{attnmt_name}")
    activation = config.get("activation_function", "gelu")
    if activation not in MARIAN_ACTIVATIONS:
        raise UserError(f"config.json: activation_function {activation!r}: attnmt's FFN computes "
                        f"{', '.join(sorted(MARIAN_ACTIVATIONS))}")
    if not config.get("scale_embedding", False):
        raise UserError("config.json: scale_embedding false: attnmt scales embeddings by sqrt(d_model)")
    for name, why in (("normalize_before", "MarianMT's blocks are post-norm"),
                      ("add_final_layer_norm", "MarianMT's post-norm blocks have no final LayerNorm"),
                      ("normalize_embedding", "attnmt has no LayerNorm on the embeddings")):
        if config.get(name):
            raise UserError(f"config.json: {name} true: attnmt imports MarianMT's layout ({why})")
    try:
        return ModelConfig(
            arch="transformer", encoder_layers=config["encoder_layers"],
            decoder_layers=config["decoder_layers"], d_model=config["d_model"],
            heads=config["encoder_attention_heads"], ffn_dim=config["encoder_ffn_dim"],
            dropout=config.get("dropout", 0.1), attention_dropout=config.get("attention_dropout", 0.0),
            ffn_dropout=config.get("activation_dropout", 0.0), norm="post", positions="sinusoidal",
            max_positions=config.get("max_position_embeddings", 512),
            tie_embeddings="all" if config.get("share_encoder_decoder_embeddings", True) else "decoder",
            activation=MARIAN_ACTIVATIONS[activation], position_layout="halves", marian_special_tokens=True)
    except KeyError as error:
        raise UserError(f"config.json has no {error.args[0]}") from None
    except (ValueError, TypeError) as error:            # a value of the wrong type or range
        raise UserError(f"config.json: {error}") from None


def read_marian_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors, names without the ``model.`` prefix, read safely."""
    if (folder / "model.safetensors").is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            weights = load_file(str(folder / "model.safetensors"))
        except (SafetensorError, OSError, ValueError) as error:
            raise UserError(f"{folder / 'model.safetensors'} cannot be read ({error})") from None
    elif (folder / "pytorch_model.bin").is_file():
        try:
            weights = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as error:               # pickle, zip and unpickling errors alike
            raise UserError(f"{folder / 'pytorch_model.bin'} cannot be read safely ({error})") from None
    else:
        raise UserError(f"{folder} is not a MarianMT folder: no model.safetensors or pytorch_model.bin")
    return {name.removeprefix("model."): tensor.float() for name, tensor in weights.items()}


def vocabulary_list(path: Path) -> list[str]:
    """``vocab.json`` (token -> id) as tokens in id order; ids must be 0..N-1."""
    entries = read_json(path)
    if not all(isinstance(i, int) for i in entries.values()):
        raise UserError(f"{path} is not a MarianMT vocabulary (a JSON object of token -> id)")
    tokens = sorted(entries, key=entries.get)
    if [entries[token] for token in tokens] != list(range(len(tokens))):
        raise UserError(f"{path}: the ids are not 0..{len(tokens) - 1}, each once")
    for special in ("<pad>", "</s>", "<unk>"):
        if special not in entries:
            raise UserError(f"{path} has no {special}, which MarianMT models need")
    return tokens


def marian_tokenizers(folder: Path, separate: bool):
    def spm_bytes(name):
        path = folder / name
        if not path.is_file():
            raise UserError(f"{folder} is not a MarianMT folder: no {name}")
        return path.read_bytes()

    source_vocabulary = vocabulary_list(folder / "vocab.json")
    target_vocabulary = vocabulary_list(folder / "target_vocab.json") if separate else source_vocabulary
    try:
        return (MarianVocabularyTokenizer(spm_bytes("source.spm"), source_vocabulary),
                MarianVocabularyTokenizer(spm_bytes("target.spm"), target_vocabulary))
    except (RuntimeError, OSError) as error:
        raise UserError(f"{folder}: a SentencePiece model cannot be read ({error})") from None


@contextlib.contextmanager
def without_random_initialisation():
    """Build a model without drawing its random initial weights (half an import's time for a
    74M model), as transformers does before loading a checkpoint: ``torch.nn.init``'s
    functions, which the layers call when they are made, do nothing meanwhile."""
    names = ("normal_", "uniform_", "xavier_uniform_", "kaiming_uniform_")
    saved = {name: getattr(torch.nn.init, name) for name in names}
    for name in names:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def check_special_ids(config: dict, target: MarianVocabularyTokenizer) -> None:
    """The config's pad, start and end ids must be the vocabulary's <pad> and </s>."""
    pad, eos = target.marian_ids[BOS_ID], target.marian_ids[EOS_ID]
    for name, wanted in (("pad_token_id", pad), ("decoder_start_token_id", pad), ("eos_token_id", eos)):
        if config.get(name, wanted) != wanted:
            raise UserError(f"config.json: {name} {config.get(name)} is not the target vocabulary's "
                            f"{'</s>' if name == 'eos_token_id' else '<pad>'} ({wanted}); attnmt "
                            "imports models whose decoder starts from <pad>")


def import_marian(folder: str | Path, run_dir: str | Path, src_lang: str = "", tgt_lang: str = "") -> Path:
    """Write the MarianMT model in ``folder`` as an attnmt run directory ``run_dir``."""
    from attnmt.checkpoint import save_weights
    from attnmt.model import build_model

    folder, run = Path(folder), Path(run_dir)
    refuse_destination_holding(run, folder, "importing")
    if run.exists() and any(run.iterdir()):
        raise UserError(f"{run} exists and is not empty; choose a new run directory")
    config_json = read_json(folder / "config.json")
    model_settings = marian_settings(config_json)
    tokenizer_config = read_json(folder / "tokenizer_config.json", optional=True)
    separate = bool(tokenizer_config.get("separate_vocabs")) or \
        not config_json.get("share_encoder_decoder_embeddings", True)
    source, target = marian_tokenizers(folder, separate)
    check_special_ids(config_json, target)
    src_lang = src_lang or tokenizer_config.get("source_lang") or ""
    tgt_lang = tgt_lang or tokenizer_config.get("target_lang") or ""
    if not (src_lang and tgt_lang):
        raise UserError(f"{folder} does not say its languages (tokenizer_config.json has no "
                        "source_lang and target_lang): give --src-lang and --tgt-lang")
    generation = read_json(folder / "generation_config.json", optional=True)
    config = imported_config(model_settings, src_lang, tgt_lang, config_json, generation)
    with without_random_initialisation():            # every weight is overwritten below
        model = build_model(config.model, source.vocab_size, target.vocab_size)
    load_marian_state(model, read_marian_weights(folder), source, target, config_json)
    temporary = fresh_temporary(run, "import")
    save_config(config, temporary / "config.yaml")
    save_tokenizers(temporary, source, target)
    save_weights(model, temporary / "best.safetensors")
    os.link(temporary / "best.safetensors", temporary / "last.safetensors")
    (temporary / "imported.json").write_text(json.dumps(
        {"from": str(folder), "model_type": "marian", "parameters": model.num_parameters()},
        indent=1) + "\n", encoding="utf-8")
    (temporary / MADE_BY_ATTNMT).unlink()              # a run directory, not an export to replace
    if run.exists():
        run.rmdir()
    temporary.rename(run)
    return run


def imported_config(model: ModelConfig, src_lang: str, tgt_lang: str, config_json: dict,
                    generation: dict) -> Config:
    """The run's config: the model's settings, and fine-tuning settings for a model of its
    size on a CPU (docs/opus-mt.md); ``data.train`` and ``data.valid`` are the user's."""
    beam = generation.get("num_beams") or config_json.get("num_beams") or 4
    return Config(
        data=DataConfig(dataset="files", src_lang=src_lang, tgt_lang=tgt_lang,
                        joint_vocab=model.tie_embeddings == "all", max_len=256),
        model=model,
        train=TrainConfig(optimizer="adamw", lr=5e-5, weight_decay=0.01, schedule="wsd", warmup=100,
                          cooldown=0.2, label_smoothing=0.1, batch_tokens=2048, max_minutes=60,
                          validate_every=500, keep_checkpoints=2),
        decode=DecodeConfig(beam=beam))


def load_marian_state(model, weights: dict, source: MarianVocabularyTokenizer,
                      target: MarianVocabularyTokenizer, config_json: dict) -> None:
    """Fill ``model`` from MarianMT's tensors (names without ``model.``)."""
    def take(name):
        if name not in weights:
            raise UserError(f"the MarianMT weights have no {name}")
        return weights[name]

    def embedding(side: str) -> torch.Tensor:          # a shared matrix is saved as shared.weight
        return weights["shared.weight"] if shared and "shared.weight" in weights \
            else take(f"{side}.embed_tokens.weight")

    shared = config_json.get("share_encoder_decoder_embeddings", True)
    decoder_embedding = embedding("decoder")
    if "lm_head.weight" in weights and not torch.equal(weights["lm_head.weight"], decoder_embedding):
        raise UserError("the MarianMT model's lm_head is not its decoder embedding; attnmt ties them")
    state = {"decoder.embedder.tokens.weight": reorder_rows(decoder_embedding, target),
             "generator.bias": reorder_rows(take("final_logits_bias").reshape(-1, 1), target).squeeze(1)}
    if not shared:
        state["encoder.embedder.tokens.weight"] = reorder_rows(embedding("encoder"), source)
    tensors = model.state_dict()
    state.update({name: take(marian_name(name)) for name in tensors if ".layers." in name})
    filled = {tensors[name].data_ptr() for name in state}
    unset = [name for name in tensors if name not in state and tensors[name].data_ptr() not in filled]
    if unset:                                   # a tied weight shares a filled one's storage
        raise UserError(f"the import left {', '.join(sorted(unset))} unset")
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as error:              # shapes that config.json does not describe
        detail = [line.strip() for line in str(error).splitlines() if "size mismatch" in line][:1]
        raise UserError(f"the MarianMT weights do not fit its config.json "
                        f"({''.join(detail) or error})") from None


def reorder_rows(rows: torch.Tensor, tokenizer: MarianVocabularyTokenizer) -> torch.Tensor:
    """MarianMT's rows in attnmt's order: row 0 (no MarianMT row) is a copy of its ``<pad>``."""
    if rows.size(0) != len(tokenizer.vocabulary):
        raise UserError(f"the weights have {rows.size(0)} vocabulary rows, the vocabulary "
                        f"{len(tokenizer.vocabulary)} entries")
    order = [tokenizer.marian_ids[BOS_ID]] + tokenizer.marian_ids[1:]
    return rows[torch.tensor(order)].clone()


# --- writing a MarianMT folder -------------------------------------------------------------

def export_transformers(run_dir: str | Path, out: str | Path, checkpoint: str = "best",
                        force: bool = False) -> Path:
    """Write the Transformer run ``run_dir`` as a MarianMT folder ``out`` that transformers'
    ``MarianMTModel`` and ``MarianTokenizer`` load."""
    from safetensors.torch import save_file

    from attnmt.export import check_destination

    run, out = Path(run_dir), Path(out)
    check_destination(run, out, force)
    config, source, target, model = RunDirectory(run).load_model(checkpoint)
    check_marian_expressible(config, source, target, run)
    permutation = model_dimension_order(config.model)
    state = {name: tensor.detach().float().clone() for name, tensor in model.state_dict().items()}
    tensors = marian_tensors(state, config, permutation, source, target)
    temporary = fresh_temporary(out, "export")
    save_file(tensors, str(temporary / "model.safetensors"), metadata={"format": "pt"})
    write_marian_vocabularies(temporary, source, target, config)
    (temporary / "config.json").write_text(json.dumps(marian_config(config, source, target), indent=1)
                                           + "\n", encoding="utf-8")
    (temporary / "generation_config.json").write_text(json.dumps(
        generation_config(config, target), indent=1) + "\n", encoding="utf-8")
    mark_made(temporary, "export")
    replace_folder(temporary, out)
    return out


def check_marian_expressible(config: Config, source, target, run: Path) -> None:
    model = config.model
    problems = [(model.arch != "transformer", f"model.arch {model.arch}: MarianMT is a Transformer"),
                (model.norm != "post", "model.norm pre: MarianMT's blocks are post-norm"),
                (model.positions != "sinusoidal", "model.positions learned: MarianMT's are sinusoids"),
                (not model.scale_attention, "model.scale_attention false: MarianMT scales by 1/sqrt(d_k)"),
                (model.tie_embeddings == "none", "model.tie_embeddings none: MarianMT ties the output "
                 "projection to the target embedding"),
                (model.tie_embeddings == "decoder" and source is target,
                 "model.tie_embeddings decoder with one joint vocabulary: MarianMT shares all three")]
    for kind in {source.kind, target.kind} - {"sentencepiece", "marian"}:
        problems.append((True, f"a {kind} tokenizer: MarianMT's tokenizer reads SentencePiece models"))
    for tokenizer in (source, target):
        if tokenizer.tags:
            problems.append((True, f"the tags {', '.join(tokenizer.tags)}: MarianTokenizer would cut "
                                   "them into pieces"))
    for refused, why in problems:
        if refused:
            raise UserError(f"{run} cannot be written as a MarianMT model: {why}")


def model_dimension_order(model: ModelConfig) -> torch.Tensor | None:
    """The permutation of the model dimension that turns interleaved sinusoids into halves
    (``[0, 2, 4, ..., 1, 3, 5, ...]``), None where the layout already is MarianMT's."""
    if model.position_layout == "halves":
        return None
    return torch.cat([torch.arange(0, model.d_model, 2), torch.arange(1, model.d_model, 2)])


def marian_tensors(state: dict, config: Config, order, source, target) -> dict[str, torch.Tensor]:
    """MarianMT's tensors (with the ``model.`` prefix) from attnmt's state dict, the model
    dimension permuted by ``order`` where given."""
    def permuted(tensor: torch.Tensor, rows: bool, columns: bool) -> torch.Tensor:
        if order is None:
            return tensor.contiguous()
        if rows:
            tensor = tensor[order]
        if columns:
            tensor = tensor[:, order]
        return tensor.contiguous()

    tensors = {}
    for name, tensor in state.items():
        if name in VOCABULARY_ROWS:
            continue                           # below, reordered
        reads_model = name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "net.0.weight"))
        writes_model = name.endswith(("out_proj.weight", "out_proj.bias", "net.3.weight", "net.3.bias",
                                      "norm.weight", "norm.bias"))
        tensors[f"model.{marian_name(name)}"] = permuted(tensor, rows=writes_model, columns=reads_model)
    decoder_rows = rows_in_marian_order(state["decoder.embedder.tokens.weight"], target)
    decoder_rows = permuted(decoder_rows, rows=False, columns=True)
    if config.model.tie_embeddings == "all":
        tensors["model.shared.weight"] = decoder_rows
    else:
        tensors["model.decoder.embed_tokens.weight"] = decoder_rows
        tensors["model.encoder.embed_tokens.weight"] = permuted(
            rows_in_marian_order(state["encoder.embedder.tokens.weight"], source), rows=False, columns=True)
    tensors["final_logits_bias"] = rows_in_marian_order(state["generator.bias"].unsqueeze(1),
                                                        target).reshape(1, -1).contiguous()
    return tensors


def marian_name(name: str) -> str:
    """MarianMT's name (without ``model.``) of one of attnmt's layer tensors:
    ``decoder.layers.3.cross_attn.q_proj.weight`` -> ``decoder.layers.3.encoder_attn.q_proj.weight``."""
    side, layers, index, rest = name.split(".", 3)
    module = next(ours for ours in LAYER_MODULES[side] if rest.startswith(ours + "."))
    return f"{side}.{layers}.{index}.{LAYER_MODULES[side][module]}{rest[len(module):]}"


def rows_in_marian_order(rows: torch.Tensor, tokenizer) -> torch.Tensor:
    """attnmt's vocabulary rows in the order of the MarianMT vocabulary written for them: an
    imported model's own order back; an attnmt vocabulary as it is (its ids are the
    MarianMT ids, ``<pad>`` 0, ``</s>`` 2, ``<unk>`` 3, the decoder starting from ``<s>``)."""
    if tokenizer.kind != "marian":
        return rows
    order = [0] * len(tokenizer.vocabulary)
    for attnmt_id, marian_id in enumerate(tokenizer.marian_ids):
        if marian_id is not None:
            order[marian_id] = attnmt_id
    return rows[torch.tensor(order)]


def marian_vocabulary(tokenizer) -> list[str]:
    if tokenizer.kind == "marian":
        return list(tokenizer.vocabulary)
    return [tokenizer.id_to_piece(index) for index in range(tokenizer.vocab_size)]


def special_ids(tokenizer) -> dict[str, int]:
    """MarianMT's ids of pad, eos and the decoder's start token."""
    if tokenizer.kind == "marian":
        pad = tokenizer.marian_ids[BOS_ID]
        return {"pad": pad, "eos": tokenizer.marian_ids[EOS_ID], "start": pad}
    return {"pad": PAD_ID, "eos": EOS_ID, "start": BOS_ID}


def write_marian_vocabularies(folder: Path, source, target, config: Config) -> None:
    for name, tokenizer in (("source.spm", source), ("target.spm", target)):
        (folder / name).write_bytes(tokenizer.model_bytes)
    separate = marian_vocabulary(source) != marian_vocabulary(target)
    vocabularies = [("vocab.json", source)] + ([("target_vocab.json", target)] if separate else [])
    for name, tokenizer in vocabularies:
        entries = {token: index for index, token in enumerate(marian_vocabulary(tokenizer))}
        (folder / name).write_text(json.dumps(entries, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    tokenizer_config = {"tokenizer_class": "MarianTokenizer", "separate_vocabs": separate,
                        "source_lang": config.data.src_lang, "target_lang": config.data.tgt_lang,
                        "model_max_length": 512, "unk_token": "<unk>", "eos_token": "</s>",
                        "pad_token": marian_vocabulary(target)[special_ids(target)["pad"]]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1) + "\n",
                                                  encoding="utf-8")


def marian_config(config: Config, source, target) -> dict:
    model, ids = config.model, special_ids(target)
    return {"model_type": "marian", "architectures": ["MarianMTModel"],
            "vocab_size": len(marian_vocabulary(source)), "decoder_vocab_size": len(marian_vocabulary(target)),
            "share_encoder_decoder_embeddings": model.tie_embeddings == "all",
            "d_model": model.d_model, "encoder_layers": model.encoder_layers,
            "decoder_layers": model.decoder_layers, "encoder_attention_heads": model.heads,
            "decoder_attention_heads": model.heads, "encoder_ffn_dim": model.ffn_dim,
            "decoder_ffn_dim": model.ffn_dim, "activation_function": model.activation,
            "dropout": model.dropout, "attention_dropout": model.attention_dropout,
            "activation_dropout": model.ffn_dropout, "max_position_embeddings": model.max_positions,
            "scale_embedding": True, "tie_word_embeddings": True, "is_encoder_decoder": True,
            "pad_token_id": ids["pad"], "eos_token_id": ids["eos"], "forced_eos_token_id": ids["eos"],
            "decoder_start_token_id": ids["start"], "init_std": 0.02, "use_cache": True}


def generation_config(config: Config, target) -> dict:
    """Decoding as the run's ``decode`` section says, as far as transformers can: its beam
    ranks by ``log P / length ** length_penalty``, attnmt's by GNMT's penalty, so only an
    alpha of 0 ranks alike."""
    ids = special_ids(target)
    settings = {"decoder_start_token_id": ids["start"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"],
                "forced_eos_token_id": ids["eos"], "num_beams": config.decode.beam,
                "length_penalty": config.decode.alpha, "max_length": config.model.max_positions}
    if config.model.marian_special_tokens:
        settings["bad_words_ids"] = [[ids["pad"]]]
    return settings

"""``attnmt export RUN OUT``: a Transformer run as a CTranslate2 model directory.

CTranslate2 is a C++ inference engine for Transformers (optional: ``pip install -e
".[ct2]"``). The conversion uses the library's own converter API: a
:class:`ctranslate2.converters.Converter` whose ``_load`` fills a
:class:`ctranslate2.specs.TransformerSpec` from our weights. What it must get right:

* post-norm or pre-norm (and the final LayerNorm of pre-norm);
* positions: the engine's built-in sinusoid is laid out as [sin | cos], ours
  interleaves sin and cos (``attnmt.transformer.sinusoidal_table``), so the table is
  always written from our model, learned or sinusoidal;
* embeddings scaled by sqrt(d_model), tied embeddings copied to each place;
* the vocabularies as pieces in id order, with our special tokens (pad, ``<s>``,
  ``</s>``, ``<unk>`` at ids 0-3), and the source ending in ``</s>`` as in training;
* LayerNorm epsilon 1e-5 (PyTorch's default), and the scores unscaled when the model
  was trained with ``model.scale_attention: false``;
* the FFN's activation (``model.activation``), and for an imported MarianMT model
  (``model.marian_special_tokens``) its own vocabulary: attnmt's row 0, which MarianMT does
  not have, left out, the decoder starting from MarianMT's ``<pad>`` (which the engine is
  told never to output, :mod:`attnmt.ctranslate2_engine`), as CTranslate2's own converter
  of the MarianMT folder has it.

The exported folder also holds the run's ``config.yaml``, its tokenizer files and
``export.json`` (the model's description and size), so it translates on its own, even
where PyTorch is not installed: ``attnmt translate OUT``. The config leaves out the folders
of the machine the run was made on that the export does not need (``data.dir``,
``data.tokenizer_from``, ``train.init_from``: it holds its own tokenizers and weights), so an
export moved to another machine names none of them.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch

from attnmt.config import Config, save_config
from attnmt.ctranslate2_engine import EXPORT_INFO, QUANTIZATIONS, require_ctranslate2
from attnmt.data import BOS_ID
from attnmt.errors import UserError
from attnmt.export_weights import VOCABULARY_ROWS
from attnmt.model import Seq2Seq
from attnmt.run import (RunDirectory, fresh_temporary, made_by, mark_made,
                        refuse_destination_holding, replace_folder)


def export_run(run_dir: str | Path, out: str | Path, quantization: str = "int8",
               checkpoint: str = "best", force: bool = False) -> Path:
    """Convert a Transformer run into a CTranslate2 model directory ``out``."""
    if quantization not in QUANTIZATIONS:
        raise UserError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")
    ctranslate2 = require_ctranslate2()
    out = Path(out)
    check_destination(Path(run_dir), out, force)
    config, source_tokenizer, target_tokenizer, model = RunDirectory(run_dir).load_model(checkpoint)
    check_exportable(model, run_dir)
    converter = _converter(model, config, [_pieces(source_tokenizer), _pieces(target_tokenizer)],
                           ctranslate2)
    temporary = fresh_temporary(out, "export")
    converted = temporary / "export"          # CTranslate2 empties the folder it writes
    converter.convert(str(converted), quantization=quantization)
    save_config(portable(config), converted / "config.yaml")    # a folder that translates
    for name in _tokenizer_files(Path(run_dir)):
        shutil.copy(Path(run_dir) / name, converted / name)
    info = {"description": model.description, "parameters": model.num_parameters(),
            "quantization": quantization, "never_output": never_output(model, target_tokenizer),
            "weights_sha256": RunDirectory(run_dir).weights_digest(checkpoint)}
    (converted / EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    mark_made(converted, "export")
    replace_folder(converted, out)
    shutil.rmtree(temporary)
    return out


def portable(config: Config) -> Config:
    """``config`` without the settings naming folders of the run's machine that an export
    does not need: where Multi30k lay, the run whose tokenizers or weights it started from."""
    return dataclasses.replace(config,
                               data=dataclasses.replace(config.data, dir="", tokenizer_from=""),
                               train=dataclasses.replace(config.train, init_from=""))


def check_destination(run: Path, out: Path, force: bool) -> None:
    """``out`` may be written when it is absent, empty, or (with ``force``) an earlier export
    holding only what the export wrote; never the run, a folder holding it, another run, a
    folder of the run or a user's files, not even with ``force``. One line otherwise,
    before anything is written."""
    refuse_destination_holding(out, run, "exporting")
    run, target = run.resolve(), out.resolve()
    if not out.exists() or not any(out.iterdir()):
        return
    if made_by(out) == "export":
        if not force:
            raise UserError(f"{out} holds an earlier export; choose another folder or add --force")
        return
    if (out / "config.yaml").is_file() and not (out / "model.bin").is_file():
        raise UserError(f"{out} is a training run, which an export never replaces (not even with "
                        "--force); choose another folder")
    if run in target.parents:
        raise UserError(f"{out} is a folder of the run {run}, which an export never replaces; "
                        "choose another folder")
    raise UserError(f"{out} holds files that 'attnmt export' did not write (an export replaces "
                    "only its own folders, not even with --force); choose another folder")


def check_exportable(model: Seq2Seq, run_dir) -> None:
    if not model.has_self_attention:
        raise UserError(f"{run_dir} holds an {model.description}; CTranslate2 runs Transformers "
                        "only (it has no RNN decoders): translate it with --engine torch")


def _tokenizer_files(run: Path) -> list[str]:
    return ["tokenizer.json"] + [path.name for path in [*run.glob("spm.*.model"), *run.glob("vocab.*.json")]]


def _pieces(tokenizer) -> list[str]:
    """The vocabulary as tokens in id order (CTranslate2 looks tokens up by string)."""
    pieces = [tokenizer.id_to_piece(index) for index in range(tokenizer.vocab_size)]
    if len(set(pieces)) != len(pieces):
        raise UserError("the vocabulary has repeated tokens and cannot be exported")
    return pieces


def _converter(model: Seq2Seq, config, vocabularies: list[list[str]], ctranslate2):
    """A CTranslate2 converter whose ``_load`` builds the spec of ``model``."""
    class AttnmtConverter(ctranslate2.converters.Converter):
        def _load(self):
            return transformer_spec(model, config, vocabularies, ctranslate2.specs)

    return AttnmtConverter()


def transformer_spec(model: Seq2Seq, config, vocabularies: list[list[str]], specs):
    """The ``TransformerSpec`` holding ``model``'s weights and vocabularies."""
    settings = config.model
    spec = specs.TransformerSpec.from_config(
        (settings.encoder_layers, settings.decoder_layers), settings.heads,
        pre_norm=settings.norm == "pre", alignment_layer=-1, alignment_heads=settings.heads,
        activation=getattr(specs.common_spec.Activation, settings.activation.upper()))
    weights = {name: tensor.detach().float().cpu() for name, tensor in model.state_dict().items()}
    zero_start = starts_from_zero(model)
    if settings.marian_special_tokens:
        # MarianMT has no row 0 (attnmt's <pad>), and CTranslate2's converter leaves out its
        # <pad> (attnmt's <s>) too, starting the decoder from a zero embedding: so do we
        # where that row is zero (always, unless the imported model's was not).
        dropped = 2 if zero_start else 1
        weights = {name: tensor[dropped:] if name in VOCABULARY_ROWS else tensor
                   for name, tensor in weights.items()}
        vocabularies = [pieces[dropped:] for pieces in vocabularies]
    _fill_stack(spec.encoder, weights, "encoder", _positions(model.encoder.embedder), settings,
                decoder=False)
    _fill_stack(spec.decoder, weights, "decoder", _positions(model.decoder.embedder), settings,
                decoder=True)
    _linear(spec.decoder.projection, weights, "generator")
    spec.config.add_source_eos = True               # training appends EOS to every source
    spec.config.add_source_bos = False
    spec.config.decoder_start_token = "</s>" if zero_start else vocabularies[1][0] \
        if settings.marian_special_tokens else "<s>"
    spec.decoder.start_from_zero_embedding = zero_start
    spec.config.layer_norm_epsilon = 1e-5
    spec.register_source_vocabulary(vocabularies[0])
    spec.register_target_vocabulary(vocabularies[1])
    return spec


def starts_from_zero(model: Seq2Seq) -> bool:
    """Whether an imported MarianMT model's decoder starts from a zero embedding (its
    ``<pad>``, attnmt's ``<s>``, a row of zeros), as CTranslate2 can be told."""
    return model.marian_special_tokens and not model.decoder.embedding.weight[BOS_ID].any()


def never_output(model: Seq2Seq, target_tokenizer) -> list[str]:
    """The tokens the engine must be told never to output: an imported MarianMT model's
    start token, where the export keeps its row."""
    return [target_tokenizer.id_to_piece(BOS_ID)] if model.marian_special_tokens \
        and not starts_from_zero(model) else []


def _positions(embedder) -> torch.Tensor:
    """Our position table ``(max_positions, d_model)``: learned weights or the sinusoid."""
    table = embedder.learned.weight if embedder.learned is not None else embedder.table
    return table.detach().float().cpu()


def _fill_stack(spec, weights: dict, side: str, positions: torch.Tensor, settings, decoder: bool):
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = weights[f"{side}.embedder.tokens.weight"]        # a list in the encoder
    spec.scale_embeddings = True
    spec.position_encodings.encodings = positions
    if settings.norm == "pre":
        _layer_norm(spec.layer_norm, weights, f"{side}.final_norm")
    for index, layer in enumerate(spec.layer):
        scope = f"{side}.layers.{index}"
        _attention(layer.self_attention, weights, f"{scope}.self_attn", settings, self_attention=True)
        _layer_norm(layer.self_attention.layer_norm, weights,
                    f"{scope}.self_norm.norm" if decoder else f"{scope}.attn_norm.norm")
        if decoder:
            _attention(layer.attention, weights, f"{scope}.cross_attn", settings, self_attention=False)
            _layer_norm(layer.attention.layer_norm, weights, f"{scope}.cross_norm.norm")
        _linear(layer.ffn.linear_0, weights, f"{scope}.ffn.net.0")
        _linear(layer.ffn.linear_1, weights, f"{scope}.ffn.net.3")
        _layer_norm(layer.ffn.layer_norm, weights, f"{scope}.ffn_norm.norm")


def _attention(spec, weights: dict, scope: str, settings, self_attention: bool):
    """Queries, keys and values fused as the engine expects: [q; k; v] for self-attention,
    q then [k; v] for cross-attention; the output projection last."""
    def part(name):
        return weights[f"{scope}.{name}.weight"], weights[f"{scope}.{name}.bias"]

    q, k, v = part("q_proj"), part("k_proj"), part("v_proj")
    fused = [q, k, v] if self_attention else [k, v]
    target = spec.linear[0] if self_attention else spec.linear[1]
    target.weight = torch.cat([w for w, _ in fused])
    target.bias = torch.cat([b for _, b in fused])
    if not self_attention:
        spec.linear[0].weight, spec.linear[0].bias = q
    _linear(spec.linear[-1], weights, f"{scope}.out_proj")
    if not settings.scale_attention:                 # scores q.k without 1/sqrt(d_k)
        spec.queries_scale = torch.tensor(1.0)


def _linear(spec, weights: dict, scope: str):
    spec.weight = weights[f"{scope}.weight"]
    if f"{scope}.bias" in weights:
        spec.bias = weights[f"{scope}.bias"]


def _layer_norm(spec, weights: dict, scope: str):
    spec.gamma = weights[f"{scope}.weight"]
    spec.beta = weights[f"{scope}.bias"]

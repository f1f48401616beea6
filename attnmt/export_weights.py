"""An export read back: the weights of a CTranslate2 ``model.bin`` as attnmt's model weights.

``attnmt export`` writes a Transformer run for CTranslate2 (:mod:`attnmt.export`); this
module is its inverse, so that an exported folder (a shipped model among them) loads into
the PyTorch engine: the attention lab shows its every layer and head, and ``attnmt train
--init-from`` fine-tunes it. Quantized weights come back as ``int8 / scale`` (CTranslate2
stores one scale per output row, ``127 / max |w_row|``), so each weight is within half a
quantization step of the original: ``|w - w'| <= max |w_row| / 254``.

The file format, as CTranslate2's ``ModelSpec._serialize`` writes it (little-endian)::

    u32 binary version, string spec name, u32 revision, u32 variable count,
    per variable: string name, u8 rank, u32 dims[rank], u8 type, u32 bytes, data
    u32 alias count, per alias: string alias, string name

where a string is a u16 length (the terminating NUL included), the bytes and the NUL.
Types are numbered float32, int8, int16, int32, float16, bfloat16. Tied weights are
written once and named again by aliases.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from attnmt.errors import UserError

# attnmt's vocabulary-sized weights, tied names included (an imported MarianMT model's
# exports leave out rows of them; the MarianMT export reorders them).
VOCABULARY_ROWS = ("encoder.embedder.tokens.weight", "encoder.embedding.weight", "decoder.embedder.tokens.weight",
                   "decoder.embedding.weight", "generator.weight", "generator.bias")
TYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
READABLE_VERSIONS = range(5, 7)


class _Reader:
    """Sequential reads from the bytes of a ``model.bin``."""

    def __init__(self, data: bytes):
        self.data, self.offset = data, 0

    def number(self, form: str) -> int:
        (value,) = struct.unpack_from("<" + form, self.data, self.offset)
        self.offset += struct.calcsize(form)
        return value

    def string(self) -> str:
        length = self.number("H")
        text = self.data[self.offset:self.offset + length - 1].decode("utf-8")
        self.offset += length
        return text

    def array(self, shape: list[int], kind: str, size: int) -> np.ndarray:
        raw = self.data[self.offset:self.offset + size]
        if len(raw) != size:
            raise ValueError("the file ends inside a variable")
        self.offset += size
        if kind == "bfloat16":                  # the high half of a float32
            values = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, kind)
        return values.reshape(shape)


def read_variables(path: Path) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 ``model.bin`` by name, aliases resolved, quantized
    weights restored to float32 (``weight / weight_scale``, one scale per row)."""
    try:
        reader = _Reader(Path(path).read_bytes())
        version = reader.number("I")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"binary version {version}, this reader knows "
                             f"{READABLE_VERSIONS.start}-{READABLE_VERSIONS.stop - 1}")
        reader.string()                               # the spec's name
        reader.number("I")                            # its revision
        variables = {}
        for _ in range(reader.number("I")):
            name = reader.string()
            shape = [reader.number("I") for _ in range(reader.number("B"))]
            kind = TYPES[reader.number("B")]
            variables[name] = reader.array(shape, kind, reader.number("I"))
        aliases = {}
        for _ in range(reader.number("I")):
            alias = reader.string()
            aliases[alias] = reader.string()
        restored = _dequantized(variables)
        for alias, name in aliases.items():
            restored[alias] = restored[name]
    except (struct.error, ValueError, IndexError, KeyError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not a CTranslate2 model attnmt can read ({error})") from None
    return restored


def _dequantized(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float32 values, each quantized weight divided by its row's scale."""
    restored = {}
    for name, value in variables.items():
        if name.endswith("_scale"):
            continue
        value = value.astype(np.float32)
        scale = variables.get(f"{name}_scale")
        if scale is not None:
            value = value / (scale.astype(np.float32).reshape(-1, 1) if scale.ndim else scale)
        restored[name] = value
    return restored


def load_export(model, folder: Path) -> None:
    """Load the weights of the export ``folder`` into ``model`` (a :class:`Seq2Seq`
    Transformer built from the export's ``config.yaml``): every weight of the model must
    be found in ``model.bin`` with its shape."""
    import torch

    variables = read_variables(Path(folder) / "model.bin")
    wanted = model.state_dict()
    found = {}
    for name, tensor in wanted.items():
        value = _value_of(name, variables)
        missing_rows = 0 if value is None else tensor.shape[0] - value.shape[0]
        if model.marian_special_tokens and name in VOCABULARY_ROWS and missing_rows in (1, 2):
            # an imported MarianMT model's export leaves out attnmt's <pad> row, and its own
            # <pad> (attnmt's <s>) where the decoder starts from zeros: those rows are zero
            value = np.concatenate([np.zeros((missing_rows, *value.shape[1:]), value.dtype), value])
        if value is None or tuple(value.shape) != tuple(tensor.shape):
            shape = "absent" if value is None else f"shape {tuple(value.shape)}"
            raise UserError(f"{folder}/model.bin does not hold this model's {name} ({shape}, "
                            f"the model needs {tuple(tensor.shape)}): was it written by 'attnmt "
                            "export' from this config?")
        found[name] = torch.from_numpy(np.ascontiguousarray(value)).to(tensor.dtype)
    model.load_state_dict(found)


def _value_of(name: str, variables: dict[str, np.ndarray]) -> np.ndarray | None:
    """The export's value of the attnmt weight ``name``, the inverse of what
    :func:`attnmt.export.transformer_spec` wrote: fused projections split again."""
    parts = name.replace(".embedding.", ".embedder.tokens.").split(".")
    if parts[0] == "generator":
        return variables.get(f"decoder/projection/{parts[-1]}")
    side, rest = parts[0], parts[1:]
    if rest[:2] == ["embedder", "tokens"]:
        return variables.get(f"{side}/embeddings/weight" if side == "decoder"
                             else f"{side}/embeddings_0/weight")
    if rest[:2] == ["embedder", "learned"]:
        return variables.get(f"{side}/position_encodings/encodings")
    if rest[0] == "final_norm":
        return variables.get(f"{side}/layer_norm/{_NORM[rest[-1]]}")
    layer, module, leaf = f"{side}/layer_{rest[1]}", rest[2], rest[-1]
    if module in _NORMS:
        return variables.get(f"{layer}/{_NORMS[module]}/layer_norm/{_NORM[leaf]}")
    if module == "ffn":
        return variables.get(f"{layer}/ffn/linear_{0 if rest[4] == '0' else 1}/{leaf}")
    projection = rest[3]
    if module == "self_attn":
        if projection == "out_proj":
            return variables.get(f"{layer}/self_attention/linear_1/{leaf}")
        return _part(variables.get(f"{layer}/self_attention/linear_0/{leaf}"), 3,
                     "qkv".index(projection[0]))
    if projection == "out_proj":                       # cross-attention
        return variables.get(f"{layer}/attention/linear_2/{leaf}")
    if projection == "q_proj":
        return variables.get(f"{layer}/attention/linear_0/{leaf}")
    return _part(variables.get(f"{layer}/attention/linear_1/{leaf}"), 2, "kv".index(projection[0]))


_NORM = {"weight": "gamma", "bias": "beta"}
_NORMS = {"attn_norm": "self_attention", "self_norm": "self_attention",
          "cross_norm": "attention", "ffn_norm": "ffn"}


def _part(fused: np.ndarray | None, count: int, index: int) -> np.ndarray | None:
    """Part ``index`` of ``count`` equal parts of a fused projection, along its rows."""
    if fused is None or fused.shape[0] % count:
        return None
    size = fused.shape[0] // count
    return fused[index * size:(index + 1) * size]

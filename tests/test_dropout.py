import pytest
import torch
import torch.nn.functional as F

from attnmt.config import ModelConfig
from attnmt.data import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnmt.dropout import drop_source_words, fast_dropout
from attnmt.masks import padding_mask, target_mask
from attnmt.model import build_model
from attnmt.train import TrainingLoss
from conftest import ARCHITECTURES, VOCAB, toy_batch


def test_fast_dropout_zeroes_a_fraction_p_and_scales_the_rest():
    torch.manual_seed(0)
    x = torch.ones(200_000)
    y = fast_dropout(x, 0.3)
    zeroed = (y == 0).float().mean().item()
    assert zeroed == pytest.approx(0.3, abs=0.005)        # binomial sd ~0.001
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.7))
    assert fast_dropout(x, 0.3, training=False) is x


def sentences(rows: int = 400, length: int = 50) -> torch.Tensor:
    """(rows, length + 3) ids: BOS, word pieces (ids 4 and up), <unk>, EOS; odd rows end in
    ten pads instead."""
    torch.manual_seed(1)
    words = torch.randint(4, 1000, (rows, length))
    src = torch.cat([torch.full((rows, 1), BOS_ID), words, torch.full((rows, 1), UNK_ID),
                     torch.full((rows, 1), EOS_ID)], dim=1)
    src[1::2, -10:] = PAD_ID
    return src


def test_source_word_dropout_blanks_a_fraction_p_of_word_pieces_only():
    src = sentences()
    dropped = drop_source_words(src, 0.25)
    changed = dropped != src
    assert (dropped[changed] == UNK_ID).all()
    assert not changed[src < 4].any(), "padding, BOS, EOS or <unk> was touched"
    rate = changed.sum().item() / (src >= 4).sum().item()
    assert rate == pytest.approx(0.25, abs=0.01)           # binomial sd ~0.0033
    assert torch.equal(dropped == PAD_ID, src == PAD_ID)


def test_source_word_dropout_off_returns_the_batch_and_draws_fresh_masks():
    src = sentences()
    assert drop_source_words(src, 0.0) is src
    first, second = drop_source_words(src, 0.1), drop_source_words(src, 0.1)
    assert not torch.equal(first, second)


def rdrop_reference(model, src, tgt_in, tgt_out, smoothing: float, alpha: float) -> torch.Tensor:
    """R-Drop (Liang et al., NeurIPS 2021) by the paper's formula, with library losses: the
    mean of two passes' cross-entropies plus alpha / 4 times the two KL divergences, summed
    over target tokens (the paper's per-sentence loss, halved)."""
    twice_src, twice_in = src.repeat(2, 1), tgt_in.repeat(2, 1)
    hidden = model.features(twice_src, padding_mask(twice_src, PAD_ID), twice_in,
                            target_mask(twice_in, PAD_ID))
    logits = model.generator(hidden).float()
    cross_entropy = F.cross_entropy(logits.flatten(0, 1), tgt_out.repeat(2, 1).flatten(),
                                    label_smoothing=smoothing, ignore_index=PAD_ID, reduction="sum")
    first, second = torch.log_softmax(logits, -1).chunk(2)
    real = (tgt_out != PAD_ID).unsqueeze(-1)
    divergence = sum((F.kl_div(q, p, log_target=True, reduction="none") * real).sum()
                     for p, q in ((first, second), (second, first)))
    return cross_entropy / 2 + alpha / 4 * divergence


def model_with_dropout(name: str):
    torch.manual_seed(0)
    return build_model(ModelConfig(**dict(ARCHITECTURES[name], dropout=0.3)), VOCAB, VOCAB)


@pytest.mark.parametrize("name", ["transformer-post", "bahdanau-additive"])
def test_rdrop_loss_equals_the_papers_formula_over_two_dropout_passes(name):
    model = model_with_dropout(name)
    src, _, tgt, _ = toy_batch()
    batch = (src, tgt[:, :-1], tgt[:, 1:])
    torch.manual_seed(5)
    ours = TrainingLoss(model)(*batch, 0.1, 5.0)
    torch.manual_seed(5)
    reference = rdrop_reference(model, *batch, 0.1, 5.0)
    assert ours.item() == pytest.approx(reference.item(), rel=1e-5)


def test_rdrop_adds_nothing_when_the_two_passes_agree():
    model = model_with_dropout("transformer-post").eval()
    src, _, tgt, _ = toy_batch()
    batch = (src, tgt[:, :-1], tgt[:, 1:])
    plain = TrainingLoss(model)(*batch, 0.1)
    assert TrainingLoss(model)(*batch, 0.1, 5.0).item() == pytest.approx(plain.item(), rel=1e-6)

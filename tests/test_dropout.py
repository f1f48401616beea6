import pytest
import torch

from attnmt.data import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnmt.dropout import drop_source_words, fast_dropout


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

import pytest
import torch

from attnmt.masks import causal_mask, padding_mask, target_mask


def test_padding_mask_from_tokens():
    tokens = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]])
    mask = padding_mask(tokens, pad=0)
    assert mask.shape == (2, 1, 4) and mask.dtype == torch.bool
    assert mask[:, 0].tolist() == [[True, True, True, False], [True, False, False, False]]


def test_padding_mask_from_lengths_matches_tokens():
    lengths = torch.tensor([3, 1, 4])
    mask = padding_mask(lengths)
    assert mask.shape == (3, 1, 4)
    assert mask.sum(-1).flatten().tolist() == [3, 1, 4]
    assert padding_mask(lengths, max_len=6).shape == (3, 1, 6)


def test_padding_mask_needs_pad_for_tokens():
    with pytest.raises(ValueError, match="pad id"):
        padding_mask(torch.zeros(2, 3, dtype=torch.long))


def test_causal_mask_is_lower_triangular():
    mask = causal_mask(4)
    assert mask.shape == (1, 4, 4) and mask.dtype == torch.bool
    for t in range(4):
        assert mask[0, t].tolist() == [j <= t for j in range(4)]


def test_target_mask_is_padding_and_causal():
    tokens = torch.tensor([[1, 5, 6, 0]])
    mask = target_mask(tokens, pad=0)
    assert mask.shape == (1, 4, 4)
    assert not mask[0, :, 3].any()            # padding key never attended
    assert mask[0, 2].tolist() == [True, True, True, False]
    assert not mask[0, 1, 2]                  # the future is masked

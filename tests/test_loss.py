import pytest
import torch
import torch.nn.functional as F

from attnmt.loss import label_smoothed_cross_entropy


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_matches_torch_cross_entropy_value_and_gradient(smoothing):
    torch.manual_seed(0)
    logits = torch.randn(13, 17, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(1, 17, (13,))
    targets[[2, 7]] = 0                                                     # ignored (padding)
    ours = label_smoothed_cross_entropy(logits, targets, smoothing, ignore_index=0)
    (ours_grad,) = torch.autograd.grad(ours * 1.7, logits)
    reference = F.cross_entropy(logits, targets, ignore_index=0, reduction="sum",
                                label_smoothing=smoothing)
    (reference_grad,) = torch.autograd.grad(reference * 1.7, logits)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(ours_grad, reference_grad)
    assert (ours_grad[[2, 7]] == 0).all()


def test_bf16_logits_give_bf16_gradient_close_to_fp32():
    torch.manual_seed(0)
    logits = torch.randn(8, 50)
    targets = torch.randint(0, 50, (8,))
    low = logits.bfloat16().requires_grad_(True)
    loss = label_smoothed_cross_entropy(low, targets, 0.1, ignore_index=-1)
    loss.backward()
    assert low.grad.dtype == torch.bfloat16
    reference = F.cross_entropy(logits.bfloat16().float(), targets, reduction="sum", label_smoothing=0.1)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)

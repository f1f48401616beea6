import pytest
import torch
import torch.nn.functional as F

from attnmt.loss import projected_cross_entropy


def reference_and_ours(dtype, smoothing, chunk_tokens, bias=True):
    torch.manual_seed(0)
    generator = torch.nn.Linear(6, 17, bias=bias).to(dtype)
    hidden = torch.randn(13, 6, dtype=dtype, requires_grad=True)
    targets = torch.randint(1, 17, (13,))
    targets[[2, 7]] = 0                                                      # padding, ignored
    ours = projected_cross_entropy(hidden, generator, targets, smoothing, 0, chunk_tokens)
    our_grads = torch.autograd.grad(ours * 1.7, [hidden, *generator.parameters()])
    reference = F.cross_entropy(generator(hidden), targets, ignore_index=0, reduction="sum",
                                label_smoothing=smoothing)
    reference_grads = torch.autograd.grad(reference * 1.7, [hidden, *generator.parameters()])
    return ours, our_grads, reference, reference_grads


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_tokens", [4, 13, 512])
def test_matches_torch_linear_and_cross_entropy(smoothing, chunk_tokens):
    ours, our_grads, reference, reference_grads = reference_and_ours(torch.float64, smoothing,
                                                                     chunk_tokens)
    torch.testing.assert_close(ours, reference)
    for mine, theirs in zip(our_grads, reference_grads):
        torch.testing.assert_close(mine, theirs)


def test_without_bias():
    ours, our_grads, reference, reference_grads = reference_and_ours(torch.float64, 0.1, 5, bias=False)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(our_grads[1], reference_grads[1])


def test_padding_rows_get_no_gradient():
    _, (grad_hidden, *_), _, _ = reference_and_ours(torch.float64, 0.1, 4)
    assert (grad_hidden[[2, 7]] == 0).all()


def test_bf16_autocast_close_to_fp32():
    torch.manual_seed(0)
    generator = torch.nn.Linear(8, 50)
    hidden = torch.randn(20, 8, requires_grad=True)
    targets = torch.randint(0, 50, (20,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = projected_cross_entropy(hidden, generator, targets, 0.1, -1, chunk_tokens=7)
    low.backward()
    assert hidden.grad.dtype == torch.float32 and generator.weight.grad.dtype == torch.float32
    reference = F.cross_entropy(generator(hidden), targets, reduction="sum", label_smoothing=0.1)
    assert low.item() == pytest.approx(reference.item(), rel=2e-2)

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


def low_precision_against_fp32(device: str, dtype: torch.dtype):
    """Loss and gradients under autocast against float32 ones, same weights and inputs."""
    torch.manual_seed(0)
    generator = torch.nn.Linear(8, 50).to(device)
    hidden = torch.randn(20, 8, device=device, requires_grad=True)
    targets = torch.randint(0, 50, (20,), device=device)
    with torch.autocast(device, dtype=dtype):
        low = projected_cross_entropy(hidden, generator, targets, 0.1, -1, chunk_tokens=7)
    low_grads = torch.autograd.grad(low, [hidden, *generator.parameters()])
    reference = F.cross_entropy(generator(hidden), targets, reduction="sum", label_smoothing=0.1)
    reference_grads = torch.autograd.grad(reference, [hidden, *generator.parameters()])
    return low, low_grads, reference, reference_grads


def test_bf16_autocast_close_to_fp32():
    low, low_grads, reference, reference_grads = low_precision_against_fp32("cpu", torch.bfloat16)
    assert low.dtype == torch.float32
    assert low.item() == pytest.approx(reference.item(), rel=2e-2)
    for ours, theirs in zip(low_grads, reference_grads):
        assert ours.dtype == torch.float32
        # bf16 keeps 8 bits of mantissa: values within a few percent of the gradient's scale
        torch.testing.assert_close(ours, theirs, atol=2e-2 * theirs.abs().max().item(), rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast with GradScaler needs CUDA")
def test_fp16_autocast_with_gradient_scaling_close_to_fp32():
    low, low_grads, reference, reference_grads = low_precision_against_fp32("cuda", torch.float16)
    assert low.item() == pytest.approx(reference.item(), rel=5e-3)
    for ours, theirs in zip(low_grads, reference_grads):
        torch.testing.assert_close(ours, theirs, atol=5e-3 * theirs.abs().max().item(), rtol=0)
    # A training step with GradScaler gives the gradients of the unscaled loss.
    model = torch.nn.Linear(8, 50).cuda()
    scaler = torch.amp.GradScaler("cuda")
    hidden, targets = torch.randn(20, 8, device="cuda"), torch.randint(0, 50, (20,), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = projected_cross_entropy(hidden, model, targets, 0.1, -1)
    scaler.scale(loss).backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler.unscale_(optimizer)
    expected = torch.autograd.grad(F.cross_entropy(model(hidden), targets, reduction="sum",
                                                   label_smoothing=0.1), model.weight)[0]
    torch.testing.assert_close(model.weight.grad, expected, atol=5e-3 * expected.abs().max().item(),
                               rtol=0)


def test_words_far_below_the_best_one_keep_the_exact_loss_and_gradient():
    """Logits spread over hundreds of nats, as a trained model makes them: the floored
    exponentials (kept out of float32's slow subnormal range) change nothing measurable."""
    torch.manual_seed(1)
    generator = torch.nn.Linear(6, 40).double()
    hidden = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        generator.weight.mul_(torch.linspace(0.0, 60.0, 40).unsqueeze(1))  # up to ~300 nats apart
    targets = torch.randint(1, 40, (9,))
    ours = projected_cross_entropy(hidden, generator, targets, 0.1, 0, chunk_tokens=4)
    reference = F.cross_entropy(generator(hidden), targets, ignore_index=0, reduction="sum",
                                label_smoothing=0.1)
    torch.testing.assert_close(ours, reference)
    our_grads = torch.autograd.grad(ours, [hidden, *generator.parameters()])
    reference_grads = torch.autograd.grad(reference, [hidden, *generator.parameters()])
    for mine, theirs in zip(our_grads, reference_grads):
        torch.testing.assert_close(mine, theirs)

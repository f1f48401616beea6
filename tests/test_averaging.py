import pytest
import torch
from torch import nn

from attnmt.averaging import ExponentialMovingAverage


def test_moving_average_equals_a_hand_computation():
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
    average = ExponentialMovingAverage(model, decay=0.5)
    shadow = torch.tensor([[1.0, -2.0]])
    for step, new in enumerate(([[3.0, 0.0]], [[0.0, 4.0]], [[2.0, 2.0]]), start=1):
        with torch.no_grad():
            model.weight.copy_(torch.tensor(new))
        average.update(model, step)
        d = min(0.5, (1 + step) / (10 + step))          # 2/11, 3/12, 4/13: the ramp, below 0.5
        shadow = d * shadow + (1 - d) * torch.tensor(new)
    assert average.factor(1) == pytest.approx(2 / 11) and average.factor(3) == pytest.approx(4 / 13)
    assert average.factor(100) == 0.5
    torch.testing.assert_close(average.state_dict()["weight"], shadow)


def test_applied_average_is_restored_and_tied_weights_count_once():
    model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5))
    model[1].weight = model[0].weight                   # tied, as the output projection
    average = ExponentialMovingAverage(model, decay=0.9)
    assert sorted(average.state_dict()) == ["0.weight", "1.bias"]
    own = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    average.update(model, 1)
    moved = [p.detach().clone() for p in model.parameters()]
    with average.applied(model):
        for parameter, before, after in zip(model.parameters(), own, moved):
            torch.testing.assert_close(parameter, before + (after - before) * (1 - 2 / 11))
    for parameter, after in zip(model.parameters(), moved):
        assert torch.equal(parameter, after)


def test_loading_another_models_average_is_refused():
    average = ExponentialMovingAverage(nn.Linear(2, 2), decay=0.9)
    with pytest.raises(ValueError, match="belongs to another model"):
        average.load_state_dict({"other.weight": torch.zeros(2, 2)})

import pytest

from attnmt.config import TrainConfig
from attnmt.errors import UserError
from attnmt.schedule import budget_progress, learning_rate


def test_step_schedules():
    noam = TrainConfig(lr=1e-3, warmup=100, schedule="noam")
    assert learning_rate(50, noam) == pytest.approx(5e-4)
    assert learning_rate(100, noam) == pytest.approx(1e-3)
    assert learning_rate(400, noam) == pytest.approx(5e-4)
    constant = TrainConfig(lr=1e-3, warmup=10, schedule="constant")
    assert learning_rate(5, constant) == pytest.approx(5e-4)
    assert learning_rate(10_000, constant) == pytest.approx(1e-3)
    plateau = TrainConfig(lr=1e-3, warmup=0, schedule="plateau")
    assert learning_rate(7, plateau, plateau_scale=0.25) == pytest.approx(2.5e-4)


def test_budget_progress_is_the_fraction_of_the_budget_used():
    steps = TrainConfig(max_steps=1000)
    assert budget_progress(250, 9999.0, 0.0, steps) == 0.25               # time is not the budget
    minutes = TrainConfig(max_minutes=10)
    assert budget_progress(5000, 150.0, 0.0, minutes) == 0.25             # steps are not
    both = TrainConfig(max_steps=1000, max_minutes=10)
    assert budget_progress(100, 300.0, 0.0, both) == 0.5                  # whichever runs out first
    assert budget_progress(900, 300.0, 0.0, both) == 0.9
    assert budget_progress(2000, 0.0, 0.0, steps) == 1.0
    assert budget_progress(100, 100.0, 0.0, TrainConfig()) == 0.0         # no budget
    epochs = TrainConfig(max_epochs=20, max_minutes=10)
    assert budget_progress(100, 60.0, 5.0, epochs) == 0.25                # passes run out first
    assert budget_progress(100, 300.0, 5.0, epochs) == 0.5                # time does
    assert budget_progress(100, 0.0, 20.0, epochs) == 1.0


def test_linear_decay_at_chosen_points():
    config = TrainConfig(lr=2e-3, warmup=100, schedule="linear", max_steps=1000)

    def at(step):
        return learning_rate(step, config, budget_progress(step, 0.0, 0.0, config))

    assert at(50) == pytest.approx(2e-3 * 0.5 * 0.95)                   # warmup times decay
    assert at(100) == pytest.approx(2e-3 * 0.9)                         # warmup end
    assert at(550) == pytest.approx(2e-3 * 0.45)
    assert at(1000) == 0.0                                               # the last update
    timed = TrainConfig(lr=2e-3, warmup=100, schedule="linear", max_minutes=10)
    assert learning_rate(5000, timed, budget_progress(5000, 450.0, 0.0, timed)) == pytest.approx(5e-4)


def test_warmup_stable_decay_at_chosen_points():
    config = TrainConfig(lr=1e-3, warmup=100, schedule="wsd", cooldown=0.2, max_minutes=100)

    def at(minutes, step=10_000):
        return learning_rate(step, config, budget_progress(step, minutes * 60.0, 0.0, config))

    assert at(1, step=25) == pytest.approx(2.5e-4)                       # warmup
    assert at(50) == pytest.approx(1e-3)                                 # stable
    assert at(80) == pytest.approx(1e-3)                                 # cooldown starts
    assert at(85) == pytest.approx(1e-3 * (1 - 0.5))                     # 1-sqrt: sqrt(1/4)
    assert at(99.2) == pytest.approx(1e-3 * (1 - 0.96 ** 0.5))
    assert at(100) == 0.0
    assert at(130) == 0.0


def test_budget_schedules_need_a_budget():
    with pytest.raises(UserError, match="train.schedule: linear decays over the budget; set "
                                        "train.max_minutes, train.max_steps or train.max_epochs"):
        TrainConfig(schedule="linear")

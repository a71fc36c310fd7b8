"""Learning-rate schedules: the paper's steps, cosine and one-cycle."""

import math

import keras
import numpy as np
import pytest

from tf_resnet import schedules


def rates(schedule, steps):
    return np.array([float(schedule(step)) for step in steps])


def test_step_schedule_is_the_papers():
    schedule = schedules.make_schedule(0.2, 1000, warmup_steps=10)
    assert isinstance(schedule, schedules.WarmupStepDecay)
    assert schedule.get_config() == {
        "peak": 0.2,
        "boundaries": [500, 750],
        "decay_rate": 0.1,
        "warmup_steps": 10,
    }
    np.testing.assert_allclose(
        rates(schedule, [0, 9, 10, 499, 500, 749, 750, 999]),
        [0.02, 0.2, 0.2, 0.2, 0.02, 0.02, 0.002, 0.002],
        rtol=1e-6,
    )


def test_onecycle_is_a_triangle():
    # Peak 0.4, 100 steps, 15 of warm-up, ends at 1% of peak.
    schedule = schedules.make_schedule(
        0.4, 100, warmup_steps=15, kind="onecycle", final_lr_fraction=0.01
    )
    assert isinstance(schedule, schedules.OneCycle)
    # Down from step 15 (peak) to step 99 (final): 84 steps of the line.
    steps = [0, 7, 14, 15, 57, 99, 150]
    expected = [
        0.4 / 15,
        0.4 * 8 / 15,
        0.4,
        0.4,
        0.004 + (0.4 - 0.004) * (1 - 42 / 84),
        0.004,
        0.004,
    ]
    np.testing.assert_allclose(rates(schedule, steps), expected, rtol=1e-5)


def test_cosine_halfway_at_midpoint_and_final_fraction_at_end():
    schedule = schedules.make_schedule(
        0.1, 201, warmup_steps=0, kind="cosine", final_lr_fraction=0.1
    )
    assert isinstance(schedule, schedules.WarmupCosineDecay)
    final = 0.01
    expected = [
        0.1,
        final + 0.09 * 0.5 * (1 + math.cos(math.pi / 4)),
        final + 0.09 / 2,
        final + 0.09 * 0.5 * (1 + math.cos(3 * math.pi / 4)),
        final,
    ]
    np.testing.assert_allclose(
        rates(schedule, [0, 50, 100, 150, 200]), expected, rtol=1e-5
    )


def test_cosine_with_warmup():
    schedule = schedules.make_schedule(0.1, 110, warmup_steps=10, kind="cosine")
    # Peak 0.1; decay over steps 10..109 (99 steps).
    np.testing.assert_allclose(
        rates(schedule, [0, 4, 9, 10, 109]),
        [0.01, 0.05, 0.1, 0.1, 0.0],
        rtol=1e-6,
        atol=1e-9,
    )
    middle = float(schedule(10 + 99 / 2))
    assert middle == pytest.approx(0.05, rel=1e-5)


def test_rate_never_rises_after_warmup():
    for kind in ("cosine", "onecycle"):
        schedule = schedules.make_schedule(0.1, 300, warmup_steps=45, kind=kind)
        values = rates(schedule, range(45, 300))
        assert np.all(np.diff(values) <= 1e-9), kind
        assert values[0] == pytest.approx(0.1)


@pytest.mark.parametrize(
    "kind, cls",
    [("cosine", schedules.WarmupCosineDecay), ("onecycle", schedules.OneCycle)],
)
def test_serializes_like_a_keras_schedule(kind, cls):
    schedule = schedules.make_schedule(
        0.1, 100, warmup_steps=5, kind=kind, final_lr_fraction=0.05
    )
    config = keras.optimizers.schedules.serialize(schedule)
    restored = keras.optimizers.schedules.deserialize(config)
    assert type(restored) is cls
    assert restored.get_config() == schedule.get_config()
    np.testing.assert_array_equal(
        rates(restored, range(100)), rates(schedule, range(100))
    )
    optimizer = keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True)
    clone = keras.optimizers.SGD.from_config(optimizer.get_config())
    assert float(clone.learning_rate) == pytest.approx(0.1 / 5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="one of step, cosine, onecycle"):
        schedules.make_schedule(0.1, 100, kind="linear")
    with pytest.raises(ValueError, match="warmup_steps"):
        schedules.make_schedule(0.1, 100, warmup_steps=100, kind="cosine")
    with pytest.raises(ValueError, match="final_lr_fraction"):
        schedules.make_schedule(
            0.1, 100, kind="onecycle", final_lr_fraction=2.0
        )

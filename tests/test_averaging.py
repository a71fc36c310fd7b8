"""`--distribution=averaging` (local SGD) on two real Horovod ranks.

Each rank's step uses the learning rate of its own batch (8 of the global
16), so an averaging run at `--learning_rate=0.8` takes the same steps as a
synchronous run at 0.4 (see tf_resnet/distribute/averaging.py).
"""

import numpy as np
import pytest

from tests import horovod_runs
from tests.helpers import requires_horovod
from tests.horovod_runs import Spec
from tf_resnet.config import DistributionConfig
from tf_resnet.distribute import make_mode
from tf_resnet.errors import UserInputError

pytestmark = requires_horovod


def test_averaging_every_step_equals_synchronous_sgd():
    """N=1 with momentum 0.9 and weight decay: the mean of the ranks' updates
    is the update of the mean gradient (all of it is linear), and with the
    slots averaged too each rank also holds synchronous SGD's momentum."""
    sync, averaged = horovod_runs.equivalence_runs(
        Spec("horovod", ranks=2, learning_rate=0.4),
        Spec("averaging", 2, learning_rate=0.8, extra=("--average_every=1",)),
    )
    assert "over 2 replica(s) (averaging)" in averaged.output
    for rank in (0, 1):
        horovod_runs.assert_same_weights(
            averaged.weights(rank), sync.weights(), sync.weights(name="first")
        )
        slots = averaged.weights(rank, name="optimizer")
        expected = sync.weights(name="optimizer")
        assert len(slots) == len(expected) > 1
        for value, reference in zip(slots, expected, strict=True):
            np.testing.assert_allclose(value, reference, rtol=1e-4, atol=1e-7)


def test_averaging_once_at_the_end_is_the_mean_of_independent_runs():
    """N = all 6 steps: each rank trains alone on its shard, then the two
    models are averaged; compare with two single-process runs, one per shard
    file, at the per-rank batch of 8."""
    averaged, *alone = horovod_runs.run_workers(
        (
            [
                *horovod_runs.equivalence_flags(0.4),
                "--distribution=averaging",
                f"--average_every={horovod_runs.STEPS}",
            ],
            2,
        ),
        *[
            (
                horovod_runs.equivalence_flags(
                    0.4, batch_size=8, train=f"shard{shard}"
                ),
                None,
            )
            for shard in (0, 1)
        ],
    )

    def mean_and_spread(name):
        first, second = (run.weights(name=name) for run in alone)
        pairs = [
            (a.astype(np.float64), b)
            for a, b in zip(first, second, strict=True)
        ]
        mean = [(a + b) / 2 for a, b in pairs]
        return mean, max(float(np.abs(a - b).max()) for a, b in pairs)

    mean, apart = mean_and_spread("weights")
    assert apart > 1e-2  # Before the average the ranks really differed.
    for rank in (0, 1):
        horovod_runs.assert_same_weights(
            averaged.weights(rank), mean, alone[0].weights(name="first")
        )
    # The optimizer: step counter 6 everywhere, momentum slots averaged.
    slots, apart = mean_and_spread("optimizer")
    assert apart > 1e-4
    for rank in (0, 1):
        ours = averaged.weights(rank, name="optimizer")
        assert ours[0] == slots[0] == horovod_runs.STEPS
        for value, expected in zip(ours, slots, strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-7)


def test_average_every_must_be_positive():
    with pytest.raises(UserInputError, match="--average_every must be"):
        make_mode("averaging", 128, DistributionConfig(average_every=0))

"""The batch plan: every batch of a run and the peak rate, worked out once."""

import ast
import dataclasses
import pathlib

import pytest

from tests.helpers import ROOT
from tf_resnet import batch_plan
from tf_resnet.config.settings import OptimConfig
from tf_resnet.errors import UserInputError

# The settings a batch plan is made of.
BATCH_SETTINGS = {
    "batch_size",
    "accumulate_steps",
    "eval_batch_size",
    "learning_rate",
}


def plan(replicas, per_update, distribution="mirrored", **optim):
    return batch_plan.plan(
        OptimConfig(**optim), replicas, per_update, distribution
    )


def test_synchronous_replicas_split_the_batch_and_share_the_update():
    batch = plan(2, 2, batch_size=256, accumulate_steps=4)
    assert (batch.global_batch, batch.replica_batch, batch.update_batch) == (
        256,
        128,
        256,
    )
    assert batch.micro_batch == 32
    assert batch.describe_micro_batches() == (
        ", each replica's batch in 4 micro-batches of 32"
    )
    # Linear scaling from batch 128: 0.1 at 128 is 0.2 at 256.
    assert batch.peak_learning_rate == pytest.approx(0.2)
    assert batch.base_learning_rate == 0.1


def test_local_updates_scale_the_rate_by_one_replicas_batch():
    # Weight averaging: each of 2 processes updates on its own 48.
    batch = plan(2, 1, "averaging", batch_size=96)
    assert (batch.replica_batch, batch.update_batch) == (48, 48)
    assert batch.peak_learning_rate == pytest.approx(0.1 * 48 / 128)
    assert batch.describe_micro_batches() == ""


def test_a_batch_the_replicas_cannot_split_is_refused():
    with pytest.raises(UserInputError) as error:
        plan(3, 3, batch_size=128)
    assert str(error.value) == (
        "--batch_size=128 is not divisible by the 3 replicas of "
        "--distribution=mirrored"
    )


def test_micro_batches_that_do_not_split_are_refused_when_asked():
    # The plan exists (an eval job never splits its batch); training asks.
    batch = plan(2, 2, batch_size=64, accumulate_steps=3)
    message = (
        "--accumulate_steps=3 does not split the 32 examples of each "
        "replica's batch (--batch_size over the replicas) into equal "
        "micro-batches"
    )
    with pytest.raises(UserInputError) as error:
        batch.micro_batch  # noqa: B018
    assert str(error.value) == message
    with pytest.raises(UserInputError, match="--accumulate_steps=3"):
        batch.describe_micro_batches()


@pytest.mark.parametrize(
    ("examples", "steps"),
    [(50_000, 390), (256, 2), (255, 1), (100, 1), (0, 1)],
)
def test_steps_per_epoch_drop_the_rest_but_are_at_least_one(examples, steps):
    assert plan(1, 1, batch_size=128).steps_per_epoch(examples) == steps


def test_examples_and_the_evaluation_batch():
    batch = plan(4, 4, batch_size=64)
    assert batch.examples(10) == 640
    assert batch.eval_batch == 64  # --eval_batch_size=0: the global batch.
    assert plan(4, 4, batch_size=64, eval_batch_size=500).eval_batch == 500


def test_the_plan_is_frozen():
    batch = plan(1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.global_batch = 256


def batch_settings_read(path):
    """`optim.<setting>` reads of a batch setting in a module, by line."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in BATCH_SETTINGS
        and (
            (isinstance(node.value, ast.Name) and node.value.id == "optim")
            or (
                isinstance(node.value, ast.Attribute)
                and node.value.attr == "optim"
            )
        )
    ]


def test_the_check_finds_a_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("a = config.optim.batch_size\nb = optim.learning_rate\n")
    assert batch_settings_read(module) == [1, 2]


def test_only_the_plan_reads_the_batch_settings():
    """Beyond the settings' own checks, a batch is the plan's to work out."""
    package = pathlib.Path(ROOT) / "tf_resnet"
    reads = {
        str(path.relative_to(ROOT)): lines
        for path in [
            *package.rglob("*.py"),
            pathlib.Path(ROOT, "resnet_main.py"),
        ]
        if path.name != "batch_plan.py"
        and package / "config" not in path.parents
        and (lines := batch_settings_read(path))
    }
    assert reads == {}

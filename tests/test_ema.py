"""Exponential moving average of the weights and BatchNorm statistics."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import run_python, sgd_step
from tf_resnet import ema as ema_lib
from tf_resnet.models import cifar_resnet


def small_model(seed=0):
    keras.utils.set_random_seed(seed)
    return cifar_resnet.cifar_resnet(8, 10, (8, 8, 3))


def snapshot(model):
    return {v.path: v.numpy().copy() for v in model.weights}


def make_step(model, ema):
    optimizer = keras.optimizers.SGD(0.5, momentum=0.9)

    @tf.function
    def step(images, labels):
        sgd_step(model, optimizer, images, labels)
        ema.update()

    return step


def batch(seed):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(1.0, 2.0, size=(8, 8, 8, 3)).astype(np.float32),
        rng.integers(0, 10, 8).astype(np.int32),
    )


@pytest.mark.parametrize("warmup", [True, False])
def test_three_updates_match_a_hand_computation(warmup):
    model = small_model()
    ema = ema_lib.ExponentialMovingAverage(model, 0.9, warmup=warmup)
    step = make_step(model, ema)
    expected = snapshot(model)
    for n in range(3):
        step(*batch(n))
        decay = min(0.9, (1 + n) / (10 + n)) if warmup else 0.9
        current = snapshot(model)
        expected = {
            path: decay * expected[path] + (1 - decay) * current[path]
            for path in expected
        }
    assert int(ema.num_updates) == 3
    assert set(ema.averages) == set(expected)
    for path, value in expected.items():
        np.testing.assert_allclose(
            ema.averages[path].numpy(), value, rtol=1e-5, atol=1e-6
        )
    # BatchNorm statistics are averaged too: they moved away from 0 and 1.
    stem_mean = ema.averages["stem_bn/moving_mean"].numpy()
    assert np.abs(stem_mean).max() > 1e-3
    assert any("moving_variance" in path for path in ema.averages)


def test_decay_warmup_follows_the_num_updates_rule():
    ema = ema_lib.ExponentialMovingAverage(small_model(), 0.99)
    decays = []
    updates = [0, 1, 2, 10, 100, 889, 890, 891, 5000]
    for n in updates:
        ema.num_updates.assign(n)
        decays.append(float(ema.current_decay()))
    expected = [min(0.99, (1 + n) / (10 + n)) for n in updates]
    np.testing.assert_allclose(decays, expected, rtol=1e-6)
    # The full decay applies from about 9 / (1 - decay) updates on.
    assert decays[5] < 0.99
    assert decays[-3:] == pytest.approx([0.99] * 3)


def test_evaluation_with_averages_leaves_raw_weights_untouched():
    model = small_model()
    ema = ema_lib.ExponentialMovingAverage(model, 0.9)
    step = make_step(model, ema)
    for n in range(3):
        step(*batch(n))
    raw = snapshot(model)
    averages = {p: v.numpy().copy() for p, v in ema.averages.items()}
    images = batch(9)[0]
    raw_logits = model(images, training=False).numpy()
    with ema.swapped():
        averaged_logits = model(images, training=False).numpy()
        for variable in model.weights:
            np.testing.assert_array_equal(
                variable.numpy(), averages[variable.path]
            )
    assert np.abs(averaged_logits - raw_logits).max() > 1e-4
    for variable in model.weights:
        np.testing.assert_array_equal(variable.numpy(), raw[variable.path])
    for path, average in ema.averages.items():
        np.testing.assert_array_equal(average.numpy(), averages[path])
    np.testing.assert_array_equal(model(images, training=False), raw_logits)
    # copy_to into another instance gives the averaged network for export.
    other = small_model(seed=5)
    ema.copy_to(other)
    np.testing.assert_allclose(
        other(images, training=False), averaged_logits, rtol=1e-5, atol=1e-5
    )


def test_swap_is_undone_when_evaluation_fails():
    model = small_model()
    ema = ema_lib.ExponentialMovingAverage(model, 0.9)
    make_step(model, ema)(*batch(0))
    raw = snapshot(model)
    with pytest.raises(RuntimeError, match="evaluation failed"), ema.swapped():
        raise RuntimeError("evaluation failed")
    for variable in model.weights:
        np.testing.assert_array_equal(variable.numpy(), raw[variable.path])


def test_checkpoint_round_trip(tmp_path):
    model = small_model()
    ema = ema_lib.ExponentialMovingAverage(model, 0.95)
    step = make_step(model, ema)
    for n in range(2):
        step(*batch(n))
    path = tf.train.Checkpoint(model=model, ema=ema).write(
        str(tmp_path / "ckpt")
    )
    saved = {p: v.numpy().copy() for p, v in ema.averages.items()}
    names = [name for name, _ in tf.train.list_variables(path)]
    # The model's variables are saved once, under the model only.
    assert not any(name.startswith("ema/_model") for name in names)

    restored_model = small_model(seed=7)
    restored = ema_lib.ExponentialMovingAverage(restored_model, 0.95)
    status = tf.train.Checkpoint(model=restored_model, ema=restored).read(path)
    status.assert_existing_objects_matched()
    assert int(restored.num_updates) == 2
    for p, value in saved.items():
        np.testing.assert_array_equal(restored.averages[p].numpy(), value)
    # Both continue identically from the restored state (the decay of
    # update 3 comes from the restored count).
    ema.update()
    restored.update()
    for p, average in ema.averages.items():
        np.testing.assert_allclose(
            restored.averages[p].numpy(), average.numpy(), rtol=1e-5, atol=1e-6
        )


def test_bad_decay_and_mismatched_model():
    with pytest.raises(ValueError, match="decay must be in"):
        ema_lib.ExponentialMovingAverage(small_model(), 1.0)
    ema = ema_lib.ExponentialMovingAverage(small_model(), 0.9)
    other = cifar_resnet.cifar_resnet(14, 10, (8, 8, 3))
    with pytest.raises(ValueError, match="does not match"):
        ema.copy_to(other)


MIRRORED = """
import keras, numpy as np, tensorflow as tf
from tf_resnet import ema as ema_lib, runtime, train_loop
from tf_resnet.config.settings import make_config
from tf_resnet.runtime import distributor_for
from tf_resnet.models import cifar_resnet
mode = distributor_for("mirrored", 16, devices=runtime.configure_devices(0, 2))
keras.utils.set_random_seed(0)
with mode.scope():
    model = cifar_resnet.cifar_resnet(8, 10, (8, 8, 3))
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    ema = ema_lib.ExponentialMovingAverage(model, 0.9, warmup=False)
config = make_config(batch_size=16)
step = mode.make_train_step(
    train_loop.make_replica_fn(model, optimizer, mode, config, ema))
rng = np.random.default_rng(0)
data = (rng.normal(size=(16, 8, 8, 3)).astype(np.float32),
        rng.integers(0, 10, 16).astype(np.int32))
iterator = mode.distribute_dataset(
    lambda *_: tf.data.Dataset.from_tensors(data).repeat())
expected = {v.path: v.numpy() for v in model.weights}
for _ in range(3):
    mode.fetch(step(iterator))
    expected = {v.path: 0.9 * expected[v.path] + 0.1 * v.numpy()
                for v in model.weights}
worst = max(float(np.abs(ema.averages[p].numpy() - e).max())
            for p, e in expected.items())
raw = {v.path: v.numpy() for v in model.weights}
with ema.swapped():
    swapped = max(float(np.abs(v.numpy() - expected[v.path]).max())
                  for v in model.weights)
after = max(float(np.abs(v.numpy() - raw[v.path]).max())
            for v in model.weights)
print(int(ema.num_updates.numpy()), worst, swapped, after)
"""


def test_under_mirrored_strategy_in_the_train_step():
    """`update()` inside `strategy.run` on 2 logical CPU replicas."""
    updates, worst, swapped, after = run_python(MIRRORED).split()[-4:]
    assert int(updates) == 3
    assert float(worst) < 1e-5
    assert float(swapped) < 1e-5
    assert float(after) == 0.0

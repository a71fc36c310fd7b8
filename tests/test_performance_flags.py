"""Correctness of the speed settings: fused BN, --dtype, --xla, threads.

Timing lives in bench/; these tests check that each setting computes what
the plain path computes, including the GPU-only paths that can run on a CPU
(float16 with loss scaling).
"""

import dataclasses
import os
import platform
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import ROOT, requires_horovod, run_python
from tf_resnet import builders, runtime, train_loop
from tf_resnet.config.settings import make_config
from tf_resnet.distribute import tf_strategy
from tf_resnet.models import blocks, cifar_resnet
from tf_resnet.models.fused_batch_norm import FusedBatchNormalization


@pytest.fixture
def policy():
    """Restores the global dtype policy a test changes."""
    previous = keras.config.dtype_policy()
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy(previous)


def twin_layers(shape, **options):
    """A Keras BN and a fused BN with the same random weights."""
    keras_bn = keras.layers.BatchNormalization(
        momentum=0.9, epsilon=1e-5, **options
    )
    fused_bn = FusedBatchNormalization(momentum=0.9, epsilon=1e-5, **options)
    rng = np.random.default_rng(1)
    for layer in (keras_bn, fused_bn):
        layer.build(shape)
    for a, b in zip(keras_bn.weights, fused_bn.weights, strict=True):
        value = rng.uniform(0.5, 1.5, size=a.shape).astype(a.dtype)
        a.assign(value)
        b.assign(value)
    return keras_bn, fused_bn


def run_layer(layer, x, training):
    # Per-element weights: with one weight per channel the gradients of
    # gamma and beta in training mode are exactly 0 plus round-off.
    weights = np.random.default_rng(2).normal(size=x.shape).astype(np.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
    grads = tape.gradient(loss, [x, *layer.trainable_weights])
    return y, grads


@pytest.mark.parametrize("training", [True, False])
def test_fused_batch_norm_matches_keras(training):
    x = tf.constant(
        np.random.default_rng(0).normal(2.0, 3.0, (8, 5, 5, 4)), tf.float32
    )
    keras_bn, fused_bn = twin_layers(x.shape)
    initial_mean = fused_bn.moving_mean.numpy()
    y_keras, grads_keras = run_layer(keras_bn, x, training)
    y_fused, grads_fused = run_layer(fused_bn, x, training)
    np.testing.assert_allclose(y_fused, y_keras, atol=1e-5)
    for fused, plain in zip(grads_fused, grads_keras, strict=True):
        np.testing.assert_allclose(fused, plain, rtol=1e-4, atol=1e-4)
    # Moving statistics: updated with the BIASED batch variance in training,
    # untouched in inference.
    for fused, plain in zip(fused_bn.weights, keras_bn.weights, strict=True):
        np.testing.assert_allclose(fused.numpy(), plain.numpy(), rtol=1e-6)
    moved = not np.allclose(fused_bn.moving_mean.numpy(), initial_mean)
    assert moved == training


def test_frozen_fused_batch_norm_uses_moving_statistics():
    x = tf.random.normal([4, 3, 3, 2], seed=1)
    keras_bn, fused_bn = twin_layers(x.shape)
    keras_bn.trainable = fused_bn.trainable = False
    before = [w.numpy() for w in fused_bn.weights]
    np.testing.assert_allclose(
        fused_bn(x, training=True), keras_bn(x, training=True), atol=1e-5
    )
    for old, new in zip(before, fused_bn.weights, strict=True):
        np.testing.assert_array_equal(old, new.numpy())


def test_fused_batch_norm_dtypes_and_fallbacks(policy):
    x = tf.random.normal([4, 3, 3, 2], seed=2)
    policy("mixed_bfloat16")
    layer = FusedBatchNormalization()
    assert layer(x, training=True).dtype == tf.bfloat16
    assert layer.moving_mean.dtype == "float32"
    policy("float64")  # No fused float64 kernel: the Keras computation.
    keras_bn, fused_bn = twin_layers(x.shape)
    x64 = tf.cast(x, tf.float64)
    np.testing.assert_allclose(
        fused_bn(x64, training=True), keras_bn(x64, training=True), atol=1e-12
    )
    policy("float32")
    keras_bn, fused_bn = twin_layers([4, 2])  # 2-D input: Keras path too.
    x2 = tf.random.normal([4, 2], seed=3)
    np.testing.assert_allclose(
        fused_bn(x2, training=True), keras_bn(x2, training=True), atol=1e-6
    )


def test_fused_batch_norm_round_trips_through_keras_config():
    layer = FusedBatchNormalization(momentum=0.8, name="bn")
    clone = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert isinstance(clone, FusedBatchNormalization)
    assert clone.momentum == pytest.approx(0.8)


def test_auto_dtype_resolution(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu avx512f avx2 amx_tile\n")
    assert runtime.cpu_bf16_flags(str(cpuinfo)) == ()
    cpuinfo.write_text("model name : X\nflags\t\t: fpu amx_bf16 amx_tile\n")
    assert runtime.cpu_bf16_flags(str(cpuinfo)) == ("amx_bf16",)
    # AMD Zen 4: AVX512-BF16 but no AMX.
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    assert runtime.cpu_bf16_flags(str(cpuinfo)) == ("avx512_bf16",)
    assert runtime.cpu_bf16_flags(str(tmp_path / "missing")) == ()
    for explicit in ("float32", "float64", "mixed_float16", "mixed_bfloat16"):
        assert runtime.resolve_dtype(explicit) == explicit
    monkeypatch.setattr(runtime, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    assert runtime.resolve_dtype("auto") == "mixed_bfloat16"
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")  # bf16 emulated: slow.
    assert runtime.resolve_dtype("auto") == "float32"
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    monkeypatch.setattr(runtime, "cpu_bf16_flags", lambda: ())
    assert runtime.resolve_dtype("auto") == "float32"


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"),
    reason="TensorFlow's oneDNN kernels are an x86 matter",
)
@pytest.mark.parametrize("value, on", [(None, True), ("0", False)])
def test_onednn_is_on_unless_turned_off(value, on):
    # TensorFlow decides as it is imported, and says so at INFO level;
    # by default it decides "off" on CPUs without AVX-512 VNNI/BF16 or AMX.
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    if value is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = value
    proc = subprocess.run(
        [sys.executable, "-c", "import resnet_main"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("oneDNN custom operations are on" in proc.stderr) == on


def tiny_training(config, steps=4, image_size=8):
    """Losses of a few steps of ResNet-8 on one fixed batch (the loop's step).

    The optimizer is the project's own (`builders.build_optimizer`: loss
    scaling under mixed_float16), at a rate of 0.1 for the batch.

    Returns the per-step mean losses and the optimizer.
    """
    keras.utils.set_random_seed(0)
    model = cifar_resnet.cifar_resnet(8, 10, (image_size, image_size, 3))
    rate = 0.1 * 128 / config.optim.batch_size  # 0.1 after linear scaling.
    config = dataclasses.replace(
        config, optim=dataclasses.replace(config.optim, learning_rate=rate)
    )
    mode = tf_strategy.default_distributor(config.optim)
    optimizer = builders.build_optimizer(config, mode, model, 1000)
    step = mode.make_train_step(
        train_loop.make_replica_fn(model, optimizer, mode, config)
    )
    rng = np.random.default_rng(0)
    batch = (
        rng.normal(
            size=(config.optim.batch_size, image_size, image_size, 3)
        ).astype(np.float32),
        rng.integers(0, 10, config.optim.batch_size).astype(np.int32),
    )
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    losses = []
    for _ in range(steps):
        metrics = mode.fetch(step(iterator))
        losses.append(metrics["loss_sum"] / metrics["examples"])
    return losses, optimizer


def test_xla_step_computes_the_same_training():
    plain, _ = tiny_training(make_config(batch_size=16))
    compiled, _ = tiny_training(make_config(batch_size=16, xla=True))
    np.testing.assert_allclose(compiled, plain, rtol=1e-3)
    assert plain[-1] < plain[0]


def test_mixed_float16_trains_with_loss_scaling(policy):
    """The GPU recipe on a CPU: float16 compute, scaled loss, falling loss."""
    policy("mixed_float16")
    losses, optimizer = tiny_training(make_config(batch_size=16), steps=6)
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert float(optimizer.dynamic_scale.numpy()) > 1.0  # Loss was scaled.
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.7 * losses[0]


def test_mixed_bfloat16_trains(policy):
    policy("mixed_bfloat16")
    losses, optimizer = tiny_training(make_config(batch_size=16), steps=6)
    # bfloat16 has float32's range: no loss scaling needed.
    assert not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert losses[-1] < 0.7 * losses[0]


@requires_horovod
def test_thread_and_horovod_settings_reach_tensorflow():
    """Parsed in a fresh process: thread pools are fixed once TF starts."""
    script = (
        "import os, sys\n"
        "from tf_resnet import runtime\n"
        "from tf_resnet.config.settings import make_config\n"
        "from tf_resnet.runtime import distributor_for\n"
        "import tensorflow as tf\n"
        "values = dict(a[2:].split('=') for a in sys.argv[1:])\n"
        "config = make_config(\n"
        "    intra_op_threads=int(values.get('intra_op_threads', 0)),\n"
        "    inter_op_threads=int(values.get('inter_op_threads', 0)),\n"
        "    dtype=values.get('dtype', 'auto'))\n"
        "started = runtime.start(config)\n"
        "mode = distributor_for('horovod', 8)  # A rank of its own (size 1).\n"
        "print(tf.config.threading.get_intra_op_parallelism_threads(),\n"
        "      tf.config.threading.get_inter_op_parallelism_threads(),\n"
        "      started.dtype_policy, os.environ['HOROVOD_CYCLE_TIME'])\n"
        "mode.shutdown()\n"
    )

    def run(*args, env=None):
        proc = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            env={
                **{k: v for k, v in os.environ.items() if "HOROVOD" not in k},
                "TF_CPP_MIN_LOG_LEVEL": "2",
                **(env or {}),
            },
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.split()

    assert run(
        "--intra_op_threads=1", "--inter_op_threads=3", "--dtype=float64"
    ) == ["1", "3", "float64", "5"]
    # An explicit horovodrun --cycle-time-ms (the same variable) wins.
    assert run(env={"HOROVOD_CYCLE_TIME": "2"})[3] == "2"


@pytest.mark.parametrize("loss_scaling", [False, True])
def test_weight_decay_gradient_equals_the_l2_penalty(loss_scaling):
    """The loop adds 2 * wd/2 * w to kernel gradients instead of
    differentiating the penalty: the update must be the same."""
    keras.utils.set_random_seed(0)
    config = make_config(batch_size=8, weight_decay=0.05)
    mode = tf_strategy.default_distributor(config.optim)
    model = cifar_resnet.cifar_resnet(8, 10, (8, 8, 3))
    optimizer = keras.optimizers.SGD(1.0)  # Update = -gradient.
    if loss_scaling:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    images = tf.random.normal([8, 8, 8, 3], seed=4)
    labels = tf.constant([0, 1, 2, 3, 4, 5, 6, 7])
    kernels = builders.decayed_variables(model)
    before = [v.numpy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = tf.reduce_sum(
            keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
        ) / 8.0 + 0.05 / 2 * tf.add_n([tf.reduce_sum(k * k) for k in kernels])
    expected = tape.gradient(loss, model.trainable_variables)
    train_loop.make_replica_fn(model, optimizer, mode, config)(images, labels)
    assert len(kernels) > 5
    for old, new, grad in zip(
        before, model.trainable_variables, expected, strict=True
    ):
        np.testing.assert_allclose(
            old - new.numpy(), grad, rtol=2e-4, atol=1e-6
        )


MIRRORED_XLA = """
import keras, numpy as np, tensorflow as tf
from tf_resnet import train_loop
from tf_resnet import runtime
from tf_resnet.config.settings import make_config
from tf_resnet.runtime import distributor_for
from tf_resnet.models import blocks, cifar_resnet
mode = distributor_for("mirrored", 16, devices=runtime.configure_devices(0, 2))
rng = np.random.default_rng(0)
batch = (rng.normal(size=(16, 8, 8, 3)).astype(np.float32),
         rng.integers(0, 10, 16).astype(np.int32))
for xla in (False, True):
    keras.utils.set_random_seed(0)
    with mode.scope():
        model = cifar_resnet.cifar_resnet(8, 10, (8, 8, 3))
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)
    config = make_config(batch_size=16, xla=xla)
    step = mode.make_train_step(
        train_loop.make_replica_fn(model, optimizer, mode, config))
    iterator = mode.distribute_dataset(
        lambda *_: tf.data.Dataset.from_tensors(batch).repeat())
    losses = []
    for _ in range(3):
        metrics = mode.fetch(step(iterator))
        losses.append(metrics["loss_sum"] / metrics["examples"])
    print(*losses)
"""


def test_xla_under_mirrored_strategy_computes_the_same_training():
    """The multi-GPU path (MirroredStrategy + XLA) on 2 logical CPUs."""
    plain, compiled = (
        [float(v) for v in line.split()]
        for line in run_python(MIRRORED_XLA).strip().splitlines()[-2:]
    )
    np.testing.assert_allclose(compiled, plain, rtol=1e-3)
    assert plain[-1] < plain[0]


def test_pooled_subsampling_equals_slicing():
    shortcut = blocks.ZeroPadShortcut(8, 2)
    x = tf.random.normal([2, 7, 6, 4], seed=1)
    gradient = tf.random.normal([2, 4, 3, 8], seed=2)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        pooled = shortcut(x)
        sliced = tf.pad(x[:, ::2, ::2, :], [[0, 0], [0, 0], [0, 0], [2, 2]])
    np.testing.assert_array_equal(pooled, sliced)
    np.testing.assert_array_equal(
        tape.gradient(pooled, x, gradient), tape.gradient(sliced, x, gradient)
    )

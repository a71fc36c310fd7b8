"""Helpers shared by the tests (fixtures stay in conftest.py).

A test module imports none of the others (`test_suite_layout` checks):
what two of them share lives here, or in a module named for what it
holds (`data_files`, `engine_runs`, `slurm_cluster`).

The scripts of the top-level `data/` folder are not a package (and would
clash with `tf_resnet.data` as a bare `data`): `load_data_script` loads one
by its path under the distinct module name `data_script_<name>`.
"""

import csv
import importlib.util
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from tf_resnet.config import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HAS_HOROVOD = importlib.util.find_spec("horovod") is not None

# Horovod builds against TensorFlow <= 2.18 only, so the newest requirement
# set (requirements-latest.txt) has none; `test_requirement_sets` makes sure
# the pinned set never skips these.
requires_horovod = pytest.mark.skipif(
    not HAS_HOROVOD,
    reason="Horovod is not installed (requirements-latest.txt has none)",
)


def pinned_version(package, requirements="requirements.txt"):
    """The version `requirements` (a file in ROOT) pins `package` to."""
    with open(os.path.join(ROOT, requirements)) as stream:
        pins = dict(
            re.findall(r"^([A-Za-z0-9_.\[\]-]+)==(\S+)", stream.read(), re.M)
        )
    return pins[package]


PINNED_TENSORFLOW = pinned_version("tensorflow-cpu")
ON_PINNED_SET = tf.__version__ == PINNED_TENSORFLOW

# CI (.ci/run) runs the suite on both requirement sets. What differs between
# the sets is TensorFlow's and Keras' behaviour, which the unit tests and
# each engine's own runs meet on both. A test whose point is not the
# TensorFlow version runs on one set only:
# * `on_one_set`, the pinned set (requirements.txt, TensorFlow 2.18, which
#   also has Horovod): the multi-process equivalences that share the Horovod
#   runs' one-process reference; what the GPU set (the pinned set's
#   variant) runs, `scripts/gpu_check.sh`, which also holds mirrored to
#   one device; and half of each repeated or twin scenario (a restart
#   at another step, a second exit timing, the other half of the
#   parameter server's failures);
# * `on_newest_set`, the newest (requirements-latest.txt): the
#   equivalences and scenarios of multi_worker and the parameter server
#   that share nothing with the Horovod runs, the course scripts' runs
#   without Horovod (the real Slurm legs run every script on the pinned
#   set), mirrored = one device on its own, the resume of the EMA and TTA
#   knobs (the plain resume runs on both), and the rest of the repeated
#   scenarios;
# * the checks of flags, presets, launchers' plans, the run directory and
#   the export folder that train only to reach them: CI runs each half of
#   the files (a-l, m-z) as a leg on each set, and these go to the lighter
#   leg of their half: `on_newest_set` in the files a-l, `on_one_set` in
#   the files m-z;
# so that each leg stays within its budget. `test_requirement_sets` makes
# sure each set runs its share.
on_one_set = pytest.mark.skipif(
    not ON_PINNED_SET,
    reason=(
        "not about the TensorFlow version: runs once in CI, on the pinned "
        f"set only (requirements.txt, TensorFlow {PINNED_TENSORFLOW}; "
        f".ci/run runs it there); skipped on TensorFlow {tf.__version__} "
        "(e.g. the newest set, requirements-latest.txt): `./setup.sh test` "
        "with the default requirements.txt runs it"
    ),
)
on_newest_set = pytest.mark.skipif(
    ON_PINNED_SET,
    reason=(
        "not about the TensorFlow version: runs once in CI, on the newest "
        "set only (requirements-latest.txt; .ci/run runs it there); skipped "
        f"on the pinned TensorFlow {PINNED_TENSORFLOW}: "
        "`TF_RESNET_REQUIREMENTS=requirements-latest.txt ./setup.sh test` "
        "runs it"
    ),
)


def one_per_set(pinned, newest):
    """Parameters of a repeated scenario: the first on each set's leg."""
    return [
        pytest.param(pinned, marks=on_one_set),
        pytest.param(newest, marks=on_newest_set),
    ]


# Enters a loopback-only network namespace, then runs bash SCRIPT.
IN_PRIVATE_NETWORK = (
    "import os, sys; from tf_resnet.launch import private_network; "
    "private_network.enter_private_network(); "
    "os.execvp('bash', ['bash', *sys.argv[1:]])"
)


def flag_values(log_root):
    """The flags' defaults, with the data paths a run needs, as flat values.

    What `config.resolve` receives from a command line that gives only
    `--train_data_path`, `--eval_data_path` and `--log_root=log_root`.
    """
    values = settings.flatten(settings.Config())
    values.update(
        train_data_path="x", eval_data_path="y", log_root=str(log_root)
    )
    return values


def load_data_script(name):
    """The module of `data/<name>.py`, loaded once per process."""
    module_name = f"data_script_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = os.path.join(ROOT, "data", f"{name}.py")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # Dataclasses look their module up.
    spec.loader.exec_module(module)
    return module


def all_batches(dataset):
    """Every `(images, labels)` batch of `dataset`, joined into two arrays."""
    batches = list(dataset)
    images = np.concatenate([images.numpy() for images, _ in batches])
    labels = np.concatenate([labels.numpy() for _, labels in batches])
    return images, labels


def run_main(args, timeout=300, env=None):
    """Runs resnet_main.py in a subprocess; returns the CompletedProcess."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "resnet_main.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
    )


def train_args(synthetic, log_root, *extra):
    """Flags of a short deterministic run on the synthetic data.

    12 steps of batch 16, a checkpoint every 2 steps, an evaluation every
    6 (of 2 batches), a progress line every step.
    """
    return [
        f"--train_data_path={synthetic['train']}",
        f"--eval_data_path={synthetic['eval']}",
        f"--log_root={log_root}",
        "--batch_size=16",
        "--train_steps=12",
        "--checkpoint_every_steps=2",
        "--eval_every_steps=6",
        "--eval_batch_count=2",
        "--log_every_steps=1",
        "--deterministic",
        *extra,
    ]


def start_main(args):
    """Starts resnet_main.py; its progress lines on the Popen's stderr."""
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "resnet_main.py"), *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def wait_for_step(proc, step):
    """Reads the progress lines until `step` is logged; returns the lines."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if re.search(rf"\] step {step}/", line):
            return lines
    raise AssertionError("run ended early:\n" + "".join(lines[-30:]))


_HOLD_LOCK = """
import sys, time
from tf_resnet import log_root_lock
log_root_lock.REFRESH_SECS = 0.2
with log_root_lock.hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def lock_holder(log_root, prefix=()):
    """A process holding the run lock of `log_root` as a chief does (it
    touches the lock, here every 0.2 s); killed or stopped, it leaves the
    lock behind. `prefix`: a command that runs it (e.g. `unshare`)."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", _HOLD_LOCK, str(log_root)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout.readline() == "held\n", proc.args
    return proc


def run_python(code, *args, timeout=300, env=None):
    """Runs `python -c code args` from the repository root; returns stdout.

    For what must start in a fresh process: thread pools, logical devices
    and strategies are fixed once TensorFlow has started. `env`: variables
    set (a None value: removed) in this process's environment for it.
    """
    environ = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={k: v for k, v in environ.items() if v is not None},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def sgd_step(model, optimizer, images, labels):
    """One plain training step: mean cross-entropy, gradients, update."""
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
        )
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(
        zip(grads, model.trainable_variables, strict=True)
    )
    return loss


def resnet8_flags(synthetic_cifar, log_root, *extra):
    """Flags of a small BatchNorm network on the synthetic data."""
    return [
        "--dataset=cifar10",
        f"--train_data_path={synthetic_cifar['train']}",
        f"--eval_data_path={synthetic_cifar['eval']}",
        f"--log_root={log_root}",
        "--model=resnet8",
        "--batch_size=32",
        *extra,
    ]


def scalars(directory, tag):
    """`(step, value)` of each `tag` summary in `directory`'s event files."""
    accumulator = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return [
        (event.step, float(tf.make_ndarray(event.tensor_proto)))
        for event in accumulator.Tensors(tag)
    ]


def checkpoint_weights(log_root):
    """Every variable of the latest checkpoint: weights, BN stats, slots."""
    reader = tf.train.load_checkpoint(str(log_root))
    return {
        name: reader.get_tensor(name)
        for name, _ in tf.train.list_variables(str(log_root))
        if name.startswith(("model/", "optimizer/"))
    }


def assert_resumed_like_uninterrupted(resumed, uninterrupted, label=""):
    """The latest checkpoint of a resumed run holds the uninterrupted run's
    variables: the same ops from a restored state, so equal to rtol 1e-5."""
    expected = checkpoint_weights(uninterrupted)
    actual = checkpoint_weights(resumed)
    assert expected.keys() == actual.keys() and len(expected) > 100, label
    for name, value in expected.items():
        np.testing.assert_allclose(
            actual[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{label}{name}"
        )


def eval_rows(log_root):
    """`(step, precision)` rows of a run's eval.csv."""
    with open(os.path.join(log_root, "eval.csv"), newline="") as stream:
        return [(r["step"], r["precision"]) for r in csv.DictReader(stream)]


def listening_ports(pid="self"):
    """TCP ports in LISTEN state in the network namespace of `pid`."""
    ports = set()
    for name in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{name}") as stream:
            for row in stream.readlines()[1:]:
                fields = row.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports

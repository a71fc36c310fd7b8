"""One profiled training step of a process of a multi-process engine.

  python -m tf_resnet.launch.horovod --np=2 --main=bench/profile_step.py \
      -- OUT distribution=horovod model=resnet20 ...
  python -m tf_resnet.launch.tf_config_cluster --np=2 \
      --main=bench/profile_step.py -- OUT distribution=multi_worker ...

Each process builds the model, optimizer and mode as a run does
(`builders`, `train_loop.make_replica_fn`, `Distributor.make_train_step`),
runs two steps, then `PROFILED_STEPS` steps each under TensorFlow's
profiler. Every process writes to OUT.<pid> (JSON) the op events of those
steps, from the profiles' XPlanes: each op's name, type, start and end in
microseconds from its step's first op.
The settings are `[--]name=value` words (`settings.make_config`'s names;
the launchers may add flags of their own), and `image_size=` and
`classes=` of the random batches (default: CIFAR-10's 32 and 10).
"""

import glob
import json
import os
import sys
import tempfile

import common
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tf_resnet.config.settings import make_config

# Steps profiled one by one: a step whose peer lags (a loaded machine)
# shows this process's all-reduces waiting for it.
PROFILED_STEPS = 5


def parse(words):
    """The output path and the `[--]name=value` words as config values."""
    values, out = {}, None
    for word in words:
        if "=" not in word:
            out = word
            continue
        name, value = word.removeprefix("--").split("=", 1)
        if value in ("True", "False"):
            value = value == "True"
        elif value.lstrip("-").isdigit():
            value = int(value)
        values[name] = value
    return out, values


def op_events(logdir):
    """`[(name, type, start_us, end_us)]` of the TensorFlow ops profiled."""
    space = xplane_pb2.XSpace()
    (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    with open(path, "rb") as stream:
        space.ParseFromString(stream.read())
    events = []
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "::" in name:  # Ops: "scope/op:Type".
                    continue
                op, kind = name.rsplit(":", 1)
                start = (line.timestamp_ns * 1000 + event.offset_ps) / 1e6
                events.append(
                    (op, kind, start, start + event.duration_ps / 1e6)
                )
    first = min(start for _, _, start, _ in events)
    return [(op, kind, s - first, e - first) for op, kind, s, e in events]


def by_step(events):
    """The events of each call of the step function, in order.

    Each call's span is the profile's event named after the function
    (`__inference_train_step...`); times relative to its start.
    """
    spans = sorted(
        (start, end)
        for name, kind, start, end in events
        if "train_step" in kind or "train_step" in name
    )
    return [
        [(n, k, s - start, e - start) for n, k, s, e in events
         if start <= s and e <= end and "train_step" not in k + n]
        for start, end in spans
    ]  # fmt: skip


def main(words):
    out, values = parse(words)
    size = values.pop("image_size", 32)
    classes = values.pop("classes", 10)
    # One intra-op thread and two inter-op ones unless the words say.
    defaults = {"intra_op_threads": 1, "inter_op_threads": 2}
    config = make_config(
        train_data_path="unused", dtype="float32", **{**defaults, **values}
    )
    mode = common.start_mode(config)
    run = common.fixed_batch_step(config, mode, size, classes, total_steps=100)
    model, step, iterator = run.model, run.step, run.iterator
    for _ in range(2):
        mode.fetch(step(iterator))
    # One profiler session for all the steps (several sessions in a row
    # once crashed a multi_worker process); the steps split by the spans
    # of the step function's own events.
    logdir = tempfile.mkdtemp(prefix="tf_resnet_profile_")
    tf.profiler.experimental.start(logdir)
    for _ in range(PROFILED_STEPS):
        mode.fetch(step(iterator))
    tf.profiler.experimental.stop()
    profiles = by_step(op_events(logdir))
    with open(f"{out}.{os.getpid()}", "w") as stream:
        json.dump(
            {
                "profiles": profiles,
                "all_reduce": mode.describe_all_reduce(
                    model.trainable_variables
                ),
            },
            stream,
        )
    mode.end_of_run()
    mode.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])

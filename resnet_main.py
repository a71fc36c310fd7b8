r"""Trains or evaluates a ResNet: the command line of tf-resnet.

  # A course task: its --preset, the data where data/download.py puts it.
  .venv/bin/python resnet_main.py --preset=course_cifar100 \
      --train_data_path=datasets/cifar-100-binary/train.bin \
      --eval_data_path=datasets/cifar-100-binary/test.bin \
      --log_root=runs/course_c100

  .venv/bin/python resnet_main.py --dataset=cifar10 \
      --train_data_path='datasets/cifar-10-batches-bin/data_batch*' \
      --eval_data_path=datasets/cifar-10-batches-bin/test_batch.bin \
      --log_root=runs/cifar10 --model=resnet20

  .venv/bin/python resnet_main.py --mode=eval --eval_once \
      --log_root=runs/cifar10 ...                  # separate eval job
  .venv/bin/python resnet_main.py --mode=export --log_root=runs/cifar10 \
      --export_dir=runs/cifar10_export             # SavedModel, .keras
  .venv/bin/python resnet_main.py --mode=export ... --litert=int8  # .tflite

TensorBoard: `.venv/bin/tensorboard --logdir=runs/cifar10`.

Exit codes: 0 done; 2 bad input or flags (one `error:` line); 3 the loss
diverged; 4 a task of a training cluster was lost (gone, cut off, or
silent for --peer_timeout_secs: `tf_resnet.peer_watch`); 128+N stopped by
signal N after a final checkpoint.
"""

import numbers
import os
import sys

import tf_resnet  # noqa: F401  # Before TensorFlow: sets its environment.
from tf_resnet import native_log  # noqa: E402

native_log.default_level()
if __name__ == "__main__":  # Before TensorFlow 2.21's import notices.
    native_log.filter_stderr()

import tensorflow as tf  # noqa: E402
from absl import app, logging  # noqa: E402

from tf_resnet import (  # noqa: E402
    dry_run,
    evaluation,
    export,
    peer_watch,
    runtime,
    train_loop,
)
from tf_resnet.checkpointing import first_line  # noqa: E402
from tf_resnet.config import flags as resnet_flags  # noqa: E402
from tf_resnet.distribute.base import LOST_TASK_ERRORS  # noqa: E402
from tf_resnet.engines import startup  # noqa: E402
from tf_resnet.engines.distributors import make_distributor, serve  # noqa: E402
from tf_resnet.errors import UserInputError  # noqa: E402

FLAGS = resnet_flags.FLAGS


def run(argv):
    """Runs the job the flags describe; returns the process exit code."""
    del argv
    try:
        config = resnet_flags.config_from_flags()
        _say_what_the_saved_config_decided(config)
        started = runtime.start(config)
        if config.run.dry_run:
            # One write: the lines of processes sharing a terminal or pipe
            # (launchers, srun) stay together.
            sys.stdout.flush()
            os.write(
                sys.stdout.fileno(),
                f"{dry_run.report(config, started)}\n".encode(),
            )
            return 0
        if config.run.mode == "export":
            export.export(config, config.run.export_dir, config.run.checkpoint)
            return 0
        dist = config.distribution
        # A task that only serves its cluster.
        if serve(started.engine, dist, config.run.log_root):
            return 0
        alone = None
        if config.run.mode == "train":  # An eval job is one process.
            alone = startup.alone(started.engine, started.reason, dist)
        distributor = make_distributor(
            started.engine,
            config.optim,
            dist,
            started.devices,
        )
        logging.info(
            "distribution %s (%s), dtype policy %s (--dtype=%s)",
            distributor.name,
            started.reason,
            started.dtype_policy,
            config.runtime.dtype,
        )
        if alone:
            logging.warning(alone)
        try:
            if config.run.mode == "train":
                result = train_loop.train(config, distributor)
                if distributor.is_chief:  # The others' would repeat it.
                    logging.info(
                        "done: %s",
                        ", ".join(
                            f"{k} {_number(v)}" for k, v in result.items()
                        ),
                    )
                    if alone:  # Said again where the run's result is read.
                        logging.warning(alone)
            else:
                evaluation.evaluate_only(config, distributor)
        finally:
            distributor.shutdown()
    except (UserInputError, FileNotFoundError) as error:
        print(f"resnet_main: error: {error}", file=sys.stderr)
        return 2
    except train_loop.TrainingDiverged as error:
        print(f"resnet_main: training diverged: {error}", file=sys.stderr)
        return 3
    except train_loop.PeerLost as error:
        # A parameter server (or another task of the cluster) is gone: its
        # variables are lost, so only a restart from the checkpoint helps.
        print(error, file=sys.stderr)
        return peer_watch.LOST_PEER
    except LOST_TASK_ERRORS as error:  # Outside training.
        print(
            peer_watch.lost_peer_line(
                None, "its peers", FLAGS.log_root, first_line(error)
            ),
            file=sys.stderr,
        )
        return peer_watch.LOST_PEER
    except train_loop.TrainingInterrupted as error:
        # 128 + its signal; a process stopped by a peer's signal exits as
        # if it had got SIGTERM, so a job's processes end with one code.
        print(f"resnet_main: stopped: {error}", file=sys.stderr)
        return 128 + error.signum
    return 0


def _say_what_the_saved_config_decided(config):
    """Names each setting `config.json` in `--log_root` gave, not a flag.

    A resumed run, the eval job and export take the run's settings from
    there; a setting the user did not ask for is then one line they see.
    """
    taken = resnet_flags.taken_from_saved()
    if taken:
        logging.info(
            "settings from %s, not from flags (a flag given wins): %s",
            os.path.join(config.run.log_root, "config.json"),
            ", ".join(f"--{k}={_flag_value(v)}" for k, v in taken.items()),
        )


def _flag_value(value):
    """A setting's value as its flag is typed (`a,b` for a list)."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return value


def _number(value):
    """`0.9930`, `390`: a result as a person reads it (not numpy's repr)."""
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.4f}"
    return str(value)


def main():
    """Entry point: parses flags with absl and exits with `run`'s code."""
    native_log.filter_stderr()  # Once: run as a module's main, not before.
    tf.get_logger().setLevel("WARNING")  # TF's per-step INFO chatter.
    resnet_flags.define_all()
    app.run(
        lambda argv: sys.exit(run(argv)),
        flags_parser=lambda argv: resnet_flags.parse(argv, __doc__),
    )


if __name__ == "__main__":
    main()

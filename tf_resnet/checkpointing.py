"""Checkpoints of a run: restore, save, and what goes wrong with them.

`RunCheckpoints` restores the newest readable checkpoint and saves new
ones, telling the user's problems apart: a checkpoint of another model
(their flags), an unreadable one (a partial copy, a bad disk: the next
older one is used), a disk that cannot be written, and a lost task of a
parameter-server cluster (not the disk at all).
"""

import os
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from tf_resnet.errors import StorageError, UserInputError


def first_line(error):
    """The first line of an error's message: TensorFlow's run on for pages."""
    return (
        str(error).strip().splitlines()[0][:300] if str(error) else repr(error)
    )


class RunCheckpoints:
    """Saves and restores the model and optimizer of a run in `log_root`."""

    def __init__(self, log_root, keep, distributor, state):
        self.log_root = log_root
        self.distributor = distributor
        self.state = state
        self.checkpoint = tf.train.Checkpoint(**state.checkpoint_objects())
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, log_root, max_to_keep=keep
        )

    @property
    def latest(self):
        return self.manager.latest_checkpoint

    def restore(self):
        """Restores the newest readable checkpoint; returns its path or None.

        A checkpoint whose files cannot be read is skipped with a warning
        and the next older one is tried.

        Raises:
          UserInputError: the checkpoint does not fit the model (another
            architecture or class count), or no checkpoint is readable.
        """
        candidates = list(reversed(self.manager.checkpoints))
        for path in candidates:
            problem = unreadable(path)
            if problem:
                logging.warning(
                    "%s: checkpoint unreadable (%s); trying the one before",
                    path,
                    problem,
                )
                continue
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as e:
                logging.warning(
                    "%s: checkpoint unreadable (%s); trying the one before",
                    path,
                    first_line(e),
                )
                continue
            except (AssertionError, ValueError, tf.errors.OpError) as error:
                raise UserInputError(
                    f"{path}: checkpoint in --log_root={self.log_root} does "
                    f"not match this model/optimizer ({first_line(error)}); "
                    "use a fresh --log_root or the flags the checkpoint was "
                    "trained with"
                ) from error
            return path
        if candidates:
            raise UserInputError(
                f"--log_root={self.log_root}: none of the checkpoints "
                f"{', '.join(os.path.basename(p) for p in candidates)} is "
                "readable; restore them from a copy or use a fresh --log_root"
            )
        return None

    def save(self, step):
        """Writes the checkpoint of `step` (the chief's is kept).

        Raises:
          StorageError: the disk refused it; names the latest complete one.
          tf.errors.UnavailableError: a task of the cluster is gone.
        """
        self.distributor.synchronize(self.state)
        directory = self.distributor.checkpoint_dir(self.log_root)
        if directory is None:
            return
        if directory != self.log_root:  # Takes part, but is not kept.
            try:
                self.checkpoint.write(os.path.join(directory, f"ckpt-{step}"))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            return
        previous = self.manager.latest_checkpoint
        try:
            self.manager.save(checkpoint_number=step)
        except tf.errors.UnavailableError:
            raise  # A task of the cluster is gone, not the disk.
        except (OSError, tf.errors.OpError) as error:
            raise StorageError(
                f"{self.log_root}: writing the checkpoint of step {step} "
                f"failed ({first_line(error)}); the latest complete "
                f"checkpoint is {previous or 'none'}"
            ) from error


def unreadable(path):
    """Why the checkpoint at `path` cannot be read, or '' if it can."""
    try:
        reader = tf.train.load_checkpoint(path)
        reader.get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError) as error:
        return first_line(error)
    return ""


def check_writable(directory):
    """Fails early, before hours of training, if outputs cannot be written."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise StorageError(
            f"{directory}: cannot write here ({error.strerror or error})"
        ) from error

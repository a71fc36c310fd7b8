"""Errors the user can act on.

Every problem with the user's input (files, flags, checkpoints) is raised as
`UserInputError`, so that `resnet_main.py` prints one clear line naming the
file and what was wrong instead of a stack trace from deep inside TensorFlow.
"""


class UserInputError(ValueError):
    """Bad input from the user: a file, a flag or a checkpoint."""


class DataError(UserInputError):
    """A dataset file or folder is missing, empty or in the wrong format."""


class StorageError(UserInputError):
    """`--log_root` (or another output) cannot be written: read-only, full."""

"""The test suite, a package so its modules import as `tests.<name>`."""

import tf_resnet  # noqa: F401  # Before TensorFlow: sets its environment.

"""The test suite, a package so its modules import as `tests.<name>`."""

import os

# Before TensorFlow is imported (conftest imports it through helpers).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tf_resnet  # noqa: E402,F401  # Before TensorFlow: sets its environment.

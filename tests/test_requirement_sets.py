"""The two requirement sets: pinned with Horovod, newest without.

CI runs the suite on both (docs/usage.md, "Versions"). The Horovod tests
skip only where Horovod cannot be installed, and the multi-process
equivalences marked `on_one_set` only where TensorFlow is not the pinned
set's, those marked `on_newest_set` only where it is (.ci/run); these
checks keep those skips honest.
"""

import os
import re

import pytest
import tensorflow as tf

from tests.helpers import (
    HAS_HOROVOD,
    PINNED_TENSORFLOW,
    ROOT,
    on_newest_set,
    on_one_set,
)
from tf_resnet.config.settings import DistributionConfig
from tf_resnet.errors import UserInputError
from tf_resnet.runtime import distributor_for


def _pins(name):
    with open(os.path.join(ROOT, name)) as stream:
        return dict(
            re.findall(r"^([A-Za-z0-9_.\[\]-]+)==(\S+)", stream.read(), re.M)
        )


def test_pinned_set_has_horovod_so_its_tests_never_skip():
    pinned = _pins("requirements.txt")
    if tf.__version__ != pinned["tensorflow-cpu"]:
        pytest.skip(f"TensorFlow {tf.__version__} is not the pinned set's")
    assert HAS_HOROVOD, "requirements.txt pins horovod but it is missing"


def test_latest_set_has_no_horovod_and_newer_tensorflow():
    pinned, latest = _pins("requirements.txt"), _pins("requirements-latest.txt")
    assert "horovod" not in latest
    version = [int(part) for part in latest["tensorflow-cpu"].split(".")]
    assert version > [int(p) for p in pinned["tensorflow-cpu"].split(".")]


def test_one_set_tests_run_on_the_pinned_set_and_skip_on_the_newest():
    pinned, latest = _pins("requirements.txt"), _pins("requirements-latest.txt")
    assert pinned["tensorflow-cpu"] == PINNED_TENSORFLOW
    assert latest["tensorflow-cpu"] != PINNED_TENSORFLOW  # So: once in CI.
    skipped = on_one_set.args[0]
    assert skipped == (tf.__version__ != PINNED_TENSORFLOW)
    assert "requirements-latest.txt" in on_one_set.kwargs["reason"]
    # The newest set's share: exactly the other way round.
    assert on_newest_set.args[0] == (tf.__version__ == PINNED_TENSORFLOW)
    assert "requirements-latest.txt" in on_newest_set.kwargs["reason"]


@pytest.mark.skipif(HAS_HOROVOD, reason="Horovod is installed here")
@pytest.mark.parametrize("distribution", ["horovod", "averaging"])
def test_horovod_modes_without_horovod_are_one_clear_error(distribution):
    with pytest.raises(UserInputError, match="needs Horovod.*requirements"):
        distributor_for(distribution, 8, DistributionConfig())

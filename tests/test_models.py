"""CIFAR ResNets: the paper's parameter counts and the block structure."""

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import on_newest_set
from tf_resnet import models
from tf_resnet.config import families, settings, validation
from tf_resnet.errors import UserInputError
from tf_resnet.models import build_model, pretrained

# He et al. 2016, Table 6 (millions of parameters, as printed).
TABLE_6 = {20: 0.27, 32: 0.46, 44: 0.66, 56: 0.85, 110: 1.7, 1202: 19.4}


def trainable_params(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


# ResNet-1202 takes over a minute to build and checks the builder, not
# the TensorFlow version: once in CI (tests/helpers.py).
@pytest.mark.parametrize(
    "depth",
    [d if d < 1000 else pytest.param(d, marks=on_newest_set) for d in TABLE_6],
)
def test_parameter_counts_match_table_6(depth):
    model = build_model(f"resnet{depth}", 10)
    millions = trainable_params(model) / 1e6
    digits = 1 if TABLE_6[depth] >= 1 else 2
    assert round(millions, digits) == TABLE_6[depth]
    stages = [layer for layer in model.layers if layer.name.startswith("stage")]
    assert [len(stage.layers) for stage in stages] == [(depth - 2) // 6] * 3


def test_shortcut_options_and_v2():
    option_a = build_model("resnet20", 10)
    option_b = build_model("resnet20", 10, shortcut="projection")
    # Two projections (16->32, 32->64): 1x1 kernels plus BN scale and shift.
    extra = (16 * 32 + 2 * 32) + (32 * 64 + 2 * 64)
    assert trainable_params(option_b) - trainable_params(option_a) == extra
    v2 = build_model("resnet20_v2", 100)
    logits = v2(tf.random.normal([2, 32, 32, 3]), training=False)
    assert logits.shape == (2, 100)


def test_any_input_size_and_unknown_name():
    model = build_model("resnet20", 10, input_shape=(64, 64, 3))
    assert model(tf.zeros([1, 64, 64, 3])).shape == (1, 10)
    with pytest.raises(UserInputError, match="unknown model 'resnet21'"):
        build_model("resnet21", 10)


def test_one_table_names_the_models_and_what_each_family_takes():
    assert set(models.MODELS) == set(families.VARIANTS)
    assert pretrained.TORCHVISION_MODELS == ("resnet18", "resnet34", "resnet50")
    config = settings.make_config(
        stem="cifar", train_data_path="x", eval_data_path="y"
    )
    refusal = "--stem is for resnet18/34/50, not resnet20"
    with pytest.raises(UserInputError, match=refusal):
        validation.validate(config)  # Before anything is built.
    with pytest.raises(UserInputError, match=refusal):
        build_model("resnet20", 10, stem="cifar")

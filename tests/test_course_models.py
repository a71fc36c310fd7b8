"""Shapes and parameter counts of course_resnet and resnet18/34/50."""

import numpy as np
import pytest

from tf_resnet.errors import UserInputError
from tf_resnet.models import build_model


def trainable_count(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def total_count(model):
    return sum(int(np.prod(v.shape)) for v in model.weights)


def conv(k, cin, cout):
    return k * k * cin * cout


def bn(channels):
    return 2 * channels  # gamma, beta (moving mean/variance not trainable)


def basic_block(cin, cout):
    params = conv(3, cin, cout) + bn(cout) + conv(3, cout, cout) + bn(cout)
    if cin != cout:  # Every shape change here also changes channels.
        params += conv(1, cin, cout) + bn(cout)
    return params


def course_formula(num_classes):
    """The assignment's table, layer by layer."""
    stem = conv(3, 3, 32) + bn(32)
    conv2 = 2 * basic_block(32, 32)
    conv3 = basic_block(32, 64) + 3 * basic_block(64, 64)
    conv4 = basic_block(64, 128) + 3 * basic_block(128, 128)
    conv5 = basic_block(128, 256) + basic_block(256, 256)
    fc = 256 * num_classes + num_classes
    return stem + conv2 + conv3 + conv4 + conv5 + fc


def test_course_formula_matches_hand_count():
    # Worked out by hand in docs/recipes.md.
    assert course_formula(100) == 3_559_556
    assert course_formula(200) == 3_585_256


@pytest.mark.parametrize(
    "num_classes, size, trainable, total",
    [(100, 32, 3_559_556, 3_565_892), (200, 64, 3_585_256, 3_591_592)],
)
def test_course_resnet_parameter_count(num_classes, size, trainable, total):
    model = build_model("course_resnet", num_classes, (size, size, 3))
    assert trainable_count(model) == trainable == course_formula(num_classes)
    # 3168 batch-norm channels carry a moving mean and variance each.
    assert total_count(model) == total == trainable + 2 * 3168


@pytest.mark.parametrize("size, final", [(32, 4), (64, 8)])
def test_course_resnet_strides_and_output(size, final):
    model = build_model("course_resnet", 7, (size, size, 3))
    shapes = {
        name: model.get_layer(name).output.shape
        for name in ("conv2_x", "conv3_x", "conv4_x", "conv5_x")
    }
    assert shapes["conv2_x"][1:] == (size, size, 32)
    assert shapes["conv3_x"][1:] == (size // 2, size // 2, 64)
    assert shapes["conv5_x"][1:] == (final, final, 256)
    logits = model(np.zeros((2, size, size, 3), np.float32), training=False)
    assert logits.shape == (2, 7)
    projections = sorted(
        v.path for v in model.weights if "shortcut/conv" in v.path
    )
    assert projections == [
        f"conv{n}_x/block0/shortcut/conv/kernel" for n in (3, 4, 5)
    ]


def test_course_resnet_dropout_is_configurable():
    model = build_model("course_resnet", 10, dropout_rate=0.3)
    assert model.get_layer("stem_dropout").rate == 0.3


@pytest.mark.parametrize(
    "name, torchvision_params",
    [
        ("resnet18", 11_689_512),
        ("resnet34", 21_797_672),
        ("resnet50", 25_557_032),
    ],
)
def test_imagenet_resnets_match_torchvision_parameter_counts(
    name, torchvision_params
):
    model = build_model(name, 1000, (224, 224, 3))
    assert trainable_count(model) == torchvision_params


def test_imagenet_stem_downsamples_by_four_and_cifar_stem_keeps_size():
    imagenet = build_model("resnet18", 10, (64, 64, 3))
    cifar = build_model("resnet18", 10, (32, 32, 3), stem="cifar")
    assert imagenet.get_layer("stage1").output.shape[1:3] == (16, 16)
    assert cifar.get_layer("stage1").output.shape[1:3] == (32, 32)
    assert cifar.get_layer("stage4").output.shape[1:3] == (4, 4)
    # 7x7 -> 3x3 stem kernel: 64 * 3 * (49 - 9) fewer weights.
    assert trainable_count(imagenet) - trainable_count(cifar) == 64 * 3 * 40


def test_unknown_stem_is_a_user_error():
    with pytest.raises(UserInputError, match="--stem"):
        build_model("resnet18", 10, stem="tiny")

"""ImageNet weight import and backbone freezing for fine-tuning."""

import h5py
import keras
import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf

from tests.data_files import state_dict_of, write_cifar_records
from tests.helpers import flag_values, on_one_set, run_main
from tf_resnet import param_groups, train_loop
from tf_resnet.config import layers as config_lib
from tf_resnet.config import settings
from tf_resnet.config.settings import make_config
from tf_resnet.distribute import base, tf_strategy
from tf_resnet.errors import UserInputError
from tf_resnet.models import build_model, pretrained

try:
    import torch
    from torch import nn
except ImportError:
    torch = None


def randomize_batch_norm(model, seed=0):
    """Non-trivial moving statistics, so an unmapped one would show."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if v.path.endswith(("moving_mean", "beta")):
            v.assign(rng.normal(0, 0.1, v.shape).astype(np.float32))
        elif v.path.endswith(("moving_variance", "gamma")):
            v.assign(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))


def write_safetensors(path, tensors):
    safetensors.numpy.save_file(
        {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
        str(path),
    )


@pytest.fixture(scope="module")
def source_resnet18():
    """A small-input ResNet-18 with random weights and BN statistics."""
    keras.utils.set_random_seed(1)
    model = build_model("resnet18", 10, (32, 32, 3), stem="cifar")
    randomize_batch_norm(model)
    return model


def assert_same_weights(a, b, skip=()):
    for va, vb in zip(a.weights, b.weights, strict=True):
        assert va.path == vb.path
        if not va.path.startswith(skip):
            np.testing.assert_array_equal(va.numpy(), vb.numpy(), va.path)


@pytest.mark.parametrize("extension", ["npz", "safetensors"])
def test_state_dict_round_trip(source_resnet18, tmp_path, extension):
    state = state_dict_of(source_resnet18)
    state["bn1.num_batches_tracked"] = np.array(7, np.int64)  # Ignored.
    path = tmp_path / f"weights.{extension}"
    if extension == "npz":
        np.savez(path, **state)
    else:
        del state["bn1.num_batches_tracked"]
        write_safetensors(path, state)
    model = build_model(
        "resnet18", 10, (32, 32, 3), pretrained=str(path), stem="cifar"
    )
    assert_same_weights(source_resnet18, model)


def test_new_class_count_replaces_only_the_classifier(
    source_resnet18, tmp_path
):
    path = tmp_path / "weights.npz"
    np.savez(path, **state_dict_of(source_resnet18))
    model = build_model("resnet18", 7, (32, 32, 3), stem="cifar")
    skipped = pretrained.load_torchvision_weights(model, str(path))
    assert skipped == ["fc.bias", "fc.weight"]
    assert model.get_layer("logits").kernel.shape == (512, 7)
    assert_same_weights(source_resnet18, model, skip="logits/")


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda s: s.pop("layer2.1.bn2.running_var"),
            "layer2.1.bn2.running_var",
        ),
        (
            lambda s: s.update({"layer5.0.conv1.weight": np.zeros(3)}),
            "unmapped tensors layer5.0.conv1.weight",
        ),
        (
            lambda s: s.update({"conv1.weight": np.zeros((64, 3, 7, 7))}),
            r"conv1.weight has shape \(64, 3, 7, 7\), resnet18 needs "
            r"\(64, 3, 3, 3\)",
        ),
    ],
    ids=["missing", "unmapped", "shape"],
)
def test_mismatched_state_dict_names_the_tensor(
    source_resnet18, tmp_path, edit, message
):
    state = state_dict_of(source_resnet18)
    edit(state)
    path = tmp_path / "weights.npz"
    np.savez(path, **state)
    model = build_model("resnet18", 10, (32, 32, 3), stem="cifar")
    before = model.get_layer("stem_conv").kernel.numpy()
    with pytest.raises(UserInputError, match=message):
        pretrained.load_torchvision_weights(model, str(path))
    # Nothing is assigned unless everything fits.
    np.testing.assert_array_equal(
        model.get_layer("stem_conv").kernel.numpy(), before
    )


@pytest.mark.parametrize(
    "name, source, message",
    [
        ("resnet18", "imagenet", "resnet50 only"),
        ("course_resnet", "w.npz", "fit only resnet18, resnet34, resnet50"),
        ("resnet18", "missing.npz", "missing.npz: no such file"),
        ("resnet18", "weights.bin", r"\.pth, \.pt, \.npz, \.safetensors"),
    ],
)
def test_bad_pretrained_source_is_a_user_error(
    tmp_path, monkeypatch, name, source, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(UserInputError, match=message):
        build_model(name, 10, (32, 32, 3), pretrained=source)


def test_imagenet_without_keras_file_says_what_to_put_where(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(UserInputError) as error:
        build_model("resnet50", 10, (64, 64, 3), pretrained="imagenet")
    assert pretrained.KERAS_RESNET50_FILE in str(error.value)
    assert str(tmp_path / "models") in str(error.value)
    assert "data/download.py --weights=keras_resnet50" in str(error.value)
    assert not (tmp_path / "models").exists()  # Nothing was downloaded.


def test_a_missing_weights_file_says_where_it_comes_from(tmp_path):
    """As typed from the docs, without the file: its address, checksum, the
    command that fetches it and where to copy it; no run folder is left."""
    data = tmp_path / "data"
    data.mkdir()
    write_cifar_records(data / "train.bin", "cifar100", 32)
    write_cifar_records(data / "test.bin", "cifar100", 16, seed=1)
    weights = tmp_path / "weights" / "resnet18-f37072fd.pth"
    common = [
        "--preset=resnet18_cifar100",
        f"--train_data_path={data / 'train.bin'}",
        f"--eval_data_path={data / 'test.bin'}",
        f"--log_root={tmp_path / 'runs' / 'r18'}",
        "--train_steps=1",
        "--batch_size=8",
    ]
    proc = run_main([f"--pretrained={weights}", *common])
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if "error:" in x]
    for said in (
        f"{weights}: no such file (--pretrained); it is torchvision's",
        "https://download.pytorch.org/models/resnet18-f37072fd.pth "
        "(sha256 starting f37072fd)",
        "data/download.py --weights=resnet18 fetches and checks it",
        f"copy that file to {weights}",
    ):
        assert said in line, line
    assert not (tmp_path / "runs" / "r18").exists()
    # A file that is there but unreadable fails later, in the run's
    # folder: which it leaves as it found it.
    weights.parent.mkdir()
    broken = weights.parent / "broken.npz"
    broken.write_bytes(b"not an archive")
    proc = run_main([f"--pretrained={broken}", *common])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "broken.npz: not a .npz archive" in proc.stderr
    assert not (tmp_path / "runs" / "r18").exists()
    assert (tmp_path / "runs").is_dir()  # The run folder only, not parents.


def test_imagenet_loads_keras_resnet50_file_from_cache(tmp_path, monkeypatch):
    from keras.src.legacy.saving import legacy_h5_format

    keras.utils.set_random_seed(2)
    reference = keras.applications.ResNet50(
        include_top=False, weights=None, input_shape=(64, 64, 3)
    )
    (tmp_path / "models").mkdir()
    with h5py.File(
        tmp_path / "models" / pretrained.KERAS_RESNET50_FILE, "w"
    ) as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, reference)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    model = build_model("resnet50", 5, (64, 64, 3), pretrained="imagenet")
    assert model.output_shape == (None, 5)
    backbone = model.get_layer("backbone")
    for expected, loaded in zip(
        reference.weights, backbone.weights, strict=True
    ):
        np.testing.assert_array_equal(expected.numpy(), loaded.numpy())
    assert not any(
        param_groups.is_backbone_variable(v)
        for v in model.get_layer("logits").weights
    )


def torch_resnet18(num_classes):
    """torchvision's ResNet-18, written out in plain torch.nn."""

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False),
                    nn.BatchNorm2d(cout),
                )

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            channels = 64
            for index, width in enumerate((64, 128, 256, 512)):
                stride = 1 if index == 0 else 2
                layer = nn.Sequential(
                    Block(channels, width, stride), Block(width, width, 1)
                )
                setattr(self, f"layer{index + 1}", layer)
                channels = width
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            for index in range(1, 5):
                x = getattr(self, f"layer{index}")(x)
            return self.fc(torch.flatten(x.mean((2, 3)), 1))

    return ResNet18()


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
def test_torchvision_resnet18_outputs_are_reproduced(tmp_path):
    torch.manual_seed(0)
    reference = torch_resnet18(num_classes=10)
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    reference.eval()
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    images = np.random.default_rng(0).normal(size=(2, 3, 64, 64))
    images = images.astype(np.float32)
    with torch.no_grad():
        expected = reference(torch.from_numpy(images)).numpy()

    model = build_model("resnet18", 10, (64, 64, 3), pretrained=str(path))
    logits = model(images.transpose(0, 2, 3, 1), training=False).numpy()
    # 1e-4 of the logits' scale: any mis-mapped tensor or shifted padding
    # window changes them by orders of magnitude more.
    scale = np.abs(expected).max()
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4 * scale)


def train_config(tmp_path, **overrides):
    write_cifar_records(tmp_path / "train.bin", "cifar10", 32, seed=0)
    write_cifar_records(tmp_path / "test.bin", "cifar10", 8, seed=1)
    values = dict(
        dataset="cifar10",
        train_data_path=str(tmp_path / "train.bin"),
        eval_data_path=str(tmp_path / "test.bin"),
        log_root=str(tmp_path / "run"),
        batch_size=8,
        log_every_steps=2,
    )
    values.update(overrides)
    return make_config(**values)


def test_backbone_is_frozen_then_trained(source_resnet18, tmp_path):
    weights = tmp_path / "start.npz"
    np.savez(weights, **state_dict_of(source_resnet18))
    # 32 examples / batch 8 = 4 steps per epoch: steps 1-4 frozen, 5-6 not.
    config = train_config(
        tmp_path,
        model="resnet18",
        stem="cifar",
        pretrained=str(weights),
        freeze_backbone_epochs=1,
        train_steps=6,
        checkpoint_every_steps=4,
    )
    train_loop.train(config, tf_strategy.default_distributor(config.optim))

    def restored(step):
        model = build_model("resnet18", 10, (32, 32, 3), stem="cifar")
        tf.train.Checkpoint(model=model).read(
            f"{config.run.log_root}/ckpt-{step}"
        ).expect_partial()
        return {v.path: v.numpy() for v in model.weights}

    start = {v.path: v.numpy() for v in source_resnet18.weights}
    frozen, trained = restored(4), restored(6)
    for path, value in start.items():
        if path.startswith("logits/"):
            assert not np.allclose(frozen[path], value), path
        else:  # Kernels and BN statistics alike.
            np.testing.assert_array_equal(frozen[path], value, path)
    for path in (
        "stem_conv/kernel",
        "stage4/block1/conv2/kernel",
        "stem_bn/gamma",
        "stem_bn/moving_mean",
        "stage3/block0/shortcut/bn/moving_variance",
    ):
        assert not np.allclose(trained[path], frozen[path]), path


@pytest.mark.parametrize("backbone, head", [(0.25, 1.0), (1.0, 0.05)])
def test_lr_multipliers_scale_backbone_and_head_updates(backbone, head):
    keras.utils.set_random_seed(3)
    model = build_model("resnet20", 3, (8, 8, 3))
    start = [v.numpy() for v in model.trainable_variables]
    rng = np.random.default_rng(0)
    images = rng.normal(size=(4, 8, 8, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 1], np.int32)
    mode = base.Distributor(settings.OptimConfig(batch_size=4))

    def update(**multipliers):
        for variable, value in zip(
            model.trainable_variables, start, strict=True
        ):
            variable.assign(value)
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        config = make_config(weight_decay=1e-3, **multipliers)
        train_loop.make_replica_fn(model, optimizer, mode, config)(
            images, labels
        )
        return {
            v.path: v.numpy() - s
            for v, s in zip(model.trainable_variables, start, strict=True)
        }

    full = update()
    scaled = update(backbone_lr_multiplier=backbone, head_lr_multiplier=head)
    for path, delta in full.items():
        factor = head if path.startswith("logits/") else backbone
        assert np.abs(delta).max() > 0, path
        np.testing.assert_allclose(scaled[path], factor * delta, atol=1e-7)


@on_one_set  # Flags, not TensorFlow (tests/helpers.py).
def test_preset_sets_defaults_and_explicit_flags_win(tmp_path):
    write_cifar_records(tmp_path / "train.bin", "cifar100", 16, seed=0)
    write_cifar_records(tmp_path / "test.bin", "cifar100", 8, seed=1)
    common = [
        f"--train_data_path={tmp_path / 'train.bin'}",
        f"--eval_data_path={tmp_path / 'test.bin'}",
        "--batch_size=8",
        "--train_steps=1",
    ]
    proc = run_main(
        ["--preset=course_cifar100", f"--log_root={tmp_path / 'a'}", *common]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Model and dataset from the preset; batch and steps from the command.
    assert "training course_resnet on cifar100" in proc.stderr
    assert "1 steps, global batch 8" in proc.stderr

    proc = run_main(
        ["--preset=resnet18_cifar100", f"--log_root={tmp_path / 'b'}", *common]
    )
    assert proc.returncode == 2
    assert "--preset=resnet18_cifar100 fine-tunes ImageNet weights" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "preset, distribution",
    [
        ("course_sync_cifar100", "horovod"),
        ("course_async_cifar100", "parameter_server"),
    ],
)
def test_distributed_presets_are_course_cifar100_on_a_cluster(
    tmp_path, preset, distribution
):
    values = flag_values(tmp_path)
    course = settings.flatten(
        config_lib.resolve({**values, "preset": "course_cifar100"}, set())
    )
    flat = settings.flatten(
        config_lib.resolve({**values, "preset": preset}, set())
    )
    assert flat["distribution"] == distribution
    # The same network, data, epochs and recipe.
    for name in (
        "dataset", "model", "train_epochs", "recipe", "lr_schedule",
        "warmup_fraction", "weight_decay", "ema_decay", "normalization",
    ):  # fmt: skip
        assert flat[name] == course[name], name
    # The same peak rate at each preset's own batch: the synchronous
    # preset's 4x batch does not scale it up a second time.
    scale = flat["batch_size"] / course["batch_size"]
    assert flat["learning_rate"] * scale == course["learning_rate"]
    # Explicit flags still win over the preset (a smaller cluster, a test).
    mine = config_lib.resolve(
        {**values, "preset": preset, "batch_size": 16, "model": "resnet20"},
        {"batch_size", "model"},
    )
    assert (mine.optim.batch_size, mine.model.model) == (16, "resnet20")
    assert mine.distribution.distribution == distribution
    # validate still runs on the layered result.
    with pytest.raises(UserInputError, match="--batch_size must be positive"):
        config_lib.resolve(
            {**values, "preset": preset, "batch_size": 0}, {"batch_size"}
        )

"""Small generated data files in the formats the project reads.

CIFAR binary records and the official python-2 pickles, a Tiny-ImageNet
folder, a torchvision-style state dict; and the data variables the batch
scripts read (`batch_job_data`), for their tests on this machine and on
the Slurm test cluster.
"""

import os
import struct

import numpy as np
import tensorflow as tf

from tf_resnet.data import DATASETS
from tf_resnet.models import build_model, pretrained


def write_cifar_records(path, dataset, count, seed=0, coarse_offset=3):
    """Writes `count` random records; returns (images [N,32,32,3], labels).

    CIFAR-100 records get a coarse label that differs from the fine one, so a
    reader that takes the wrong byte fails the tests.
    """
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
    num_classes = DATASETS[dataset].num_classes
    labels = rng.integers(0, num_classes, size=count, dtype=np.uint8)
    planes = images.transpose(0, 3, 1, 2).reshape(count, -1)
    if dataset == "cifar10":
        header = labels[:, None]
    else:
        coarse = ((labels.astype(int) + coarse_offset) % 20).astype(np.uint8)
        header = np.stack([coarse, labels], axis=1)
    with open(path, "wb") as stream:
        stream.write(np.concatenate([header, planes], axis=1).tobytes())
    return images, labels


def _py2_str(raw):
    """A Python 2 `str`, as cPickle wrote it (SHORT_BINSTRING/BINSTRING)."""
    if len(raw) < 256:
        return b"U" + bytes([len(raw)]) + raw
    return b"T" + struct.pack("<i", len(raw)) + raw


def _py2_int(value):
    return (
        b"K" + bytes([value])
        if value < 256
        else b"J" + struct.pack("<i", value)
    )


def _py2_uint8_array(array):
    """A uint8 ndarray exactly as numpy 1 on Python 2 pickled it."""
    shape = b"(" + b"".join(_py2_int(n) for n in array.shape) + b"t"
    dtype = (
        b"cnumpy\ndtype\n" + _py2_str(b"u1") + b"K\x00K\x01\x87R"
        b"(K\x03"
        + _py2_str(b"|")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    )
    return (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        b"K\x00\x85" + _py2_str(b"b") + b"\x87R"
        b"(K\x01" + shape + dtype + b"\x89" + _py2_str(array.tobytes()) + b"tb"
    )


def _py2_value(value):
    if isinstance(value, np.ndarray):
        return _py2_uint8_array(value)
    if isinstance(value, bytes):
        return _py2_str(value)
    if isinstance(value, int):
        return _py2_int(value)
    items = b"".join(_py2_value(item) for item in value)
    return b"](" + items + b"e"


def write_py2_pickle(path, batch):
    """Writes `{bytes: array | list | bytes}` as a protocol-2 Python 2 file."""
    items = b"".join(_py2_str(k) + _py2_value(v) for k, v in batch.items())
    with open(path, "wb") as stream:
        stream.write(b"\x80\x02}(" + items + b"u.")


# Created in this (unsorted) order: labels must follow the sorted names.
WNIDS = ("n03000000", "n01000000", "n02000000")


def write_jpeg(path, rng, grayscale=False, size=64):
    channels = 1 if grayscale else 3
    pixels = rng.integers(0, 256, (size, size, channels), dtype=np.uint8)
    encoded = tf.io.encode_jpeg(pixels, quality=95).numpy()
    with open(path, "wb") as stream:
        stream.write(encoded)
    # The exact pixels a JPEG reader must return (JPEG is lossy).
    return tf.io.decode_jpeg(encoded, channels=3).numpy()


def write_tiny_imagenet(root, train_per_class=4, val_per_class=2, seed=0):
    """Official layout; returns {"train"/"val": [(path, label, pixels)]}."""
    rng = np.random.default_rng(seed)
    label_of = {wnid: i for i, wnid in enumerate(sorted(WNIDS))}
    written = {"train": [], "val": []}
    for wnid in WNIDS:
        folder = os.path.join(root, "train", wnid, "images")
        os.makedirs(folder)
        with open(os.path.join(root, "train", wnid, f"{wnid}_boxes.txt"), "w"):
            pass
        for i in range(train_per_class):
            path = os.path.join(folder, f"{wnid}_{i}.JPEG")
            pixels = write_jpeg(path, rng, grayscale=i == 1)
            written["train"].append((path, label_of[wnid], pixels))
    os.makedirs(os.path.join(root, "val", "images"))
    lines = []
    for k in range(val_per_class * len(WNIDS)):
        wnid = WNIDS[(k * 2) % len(WNIDS)]
        path = os.path.join(root, "val", "images", f"val_{k}.JPEG")
        pixels = write_jpeg(path, rng, grayscale=k == 0)
        written["val"].append((path, label_of[wnid], pixels))
        lines.append(f"val_{k}.JPEG\t{wnid}\t0\t1\t60\t62\n")
    # Not in file-name order: the reader must keep the annotation order.
    order = [3, 0, 5, 1, 4, 2][: len(lines)]
    with open(os.path.join(root, "val", "val_annotations.txt"), "w") as out:
        out.writelines(lines[i] for i in order)
    written["val"] = [written["val"][i] for i in order]
    written["train"].sort(key=lambda item: (item[1], item[0]))
    return written


def to_torch_layout(value):
    if value.ndim == 4:
        return value.transpose(3, 2, 0, 1)  # HWIO -> OIHW
    if value.ndim == 2:
        return value.T
    return value


def state_dict_of(model):
    """A torchvision-style state dict exported from a Keras model."""
    return {
        pretrained.torch_name(v.path): to_torch_layout(v.numpy())
        for v in model.weights
    }


def cifar100_files(folder):
    """CIFAR-100 binary files in `folder`, as the cifar100 presets read."""
    write_cifar_records(folder / "train.bin", "cifar100", 64, seed=0)
    write_cifar_records(folder / "test.bin", "cifar100", 16, seed=1)
    return {
        "TRAIN_DATA": str(folder / "train.bin"),
        "EVAL_DATA": str(folder / "test.bin"),
    }


def tiny_imagenet_root(folder):
    """A DATA_ROOT in `folder` with a small tiny-imagenet-200/."""
    write_tiny_imagenet(str(folder / "tiny-imagenet-200"))
    return str(folder)


def resnet18_weights_file(folder):
    """A torchvision-style ResNet-18 state dict (random), for PRETRAINED."""
    path = folder / "resnet18.npz"
    model = build_model("resnet18", 100, (32, 32, 3), stem="cifar")
    np.savez(path, **state_dict_of(model))
    return str(path)


def batch_job_data(folder):
    """Generated CIFAR-10 and -100, Tiny-ImageNet, ResNet-18 weights.

    As the batch scripts' data variables (DATA, TRAIN_DATA, EVAL_DATA,
    DATA_ROOT, PRETRAINED), every file in `folder`.
    """
    cifar10 = folder / "cifar-10-batches-bin"
    cifar10.mkdir()
    write_cifar_records(cifar10 / "data_batch_1.bin", "cifar10", 64, seed=2)
    write_cifar_records(cifar10 / "test_batch.bin", "cifar10", 16, seed=3)
    return {
        "DATA": str(cifar10),
        **cifar100_files(folder),
        "DATA_ROOT": tiny_imagenet_root(folder),
        "PRETRAINED": resnet18_weights_file(folder),
    }

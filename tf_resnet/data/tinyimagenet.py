"""Reader for the Tiny-ImageNet-200 folders, exactly as distributed.

Layout of the root folder (`tiny-imagenet-200/`):

* `train/<wnid>/images/*.JPEG`: the training images of one class;
* `val/images/*.JPEG` with `val/val_annotations.txt`, one tab-separated
  line per image: file name, wnid, bounding box;
* `words.txt`: `wnid<TAB>words` for all of ImageNet's wnids, which name the
  classes (optional: without it the split has no class names).

Classes are the SORTED wnid folder names of `train/`, so class indices are
those of torchvision's `ImageFolder` (and of `wnids.txt` sorted), and a model
trained here can be compared with one trained there. The validation split is
read straight from the annotation file: nothing is moved or rewritten.

`FolderSplit` reads the training split when `training=True` and the
validation split otherwise; both take the root folder as their data path.

Every listed file is checked when the split is opened (JPEG start and end
markers), so a broken download fails with a `DataError` naming the file
instead of a decode error deep inside `tf.data` hours into a run. Only the
first and last two bytes are read, which keeps the check small next to
the start-up of a run (bench/results/open_split.md has the numbers).
"""

import os

import tensorflow as tf

from tf_resnet.config.datasets import DATASETS
from tf_resnet.data.split import Split
from tf_resnet.errors import DataError

IMAGE_SIZE = DATASETS["tinyimagenet"].image_size
_JPEG_START = b"\xff\xd8"
_JPEG_END = b"\xff\xd9"
_JPEG_SUFFIXES = (".jpeg", ".jpg")


def class_wnids(root):
    """Sorted wnid folder names of `root/train`: index = class label."""
    train = os.path.join(root, "train")
    if not os.path.isdir(root):
        raise DataError(
            f"{root}: no such folder (expected the Tiny-ImageNet "
            "root holding train/ and val/)"
        )
    if not os.path.isdir(train):
        raise DataError(
            f"{train}: missing; the data path must be the "
            "Tiny-ImageNet root folder holding train/ and val/"
        )
    names = sorted(e.name for e in os.scandir(train) if e.is_dir())
    if not names:
        raise DataError(f"{train}: holds no class folders")
    return names


def check_jpeg(path):
    """Raises `DataError` unless `path` looks like a whole JPEG file.

    It must start with the start-of-image marker FF D8 and end with the
    end-of-image marker FF D9 (every file of Tiny-ImageNet does), which
    catches empty, truncated and non-JPEG files from their first and last
    two bytes.
    """
    try:
        with open(path, "rb") as stream:
            head = stream.read(2)
            stream.seek(max(0, os.fstat(stream.fileno()).st_size - 2))
            tail = stream.read(2)
    except FileNotFoundError:
        raise DataError(f"{path}: listed image file is missing") from None
    if not head:
        raise DataError(f"{path}: image file is empty")
    if head != _JPEG_START:
        raise DataError(
            f"{path}: not a JPEG (starts with bytes {head.hex(' ')}, "
            "expected ff d8)"
        )
    if tail != _JPEG_END:
        raise DataError(
            f"{path}: JPEG is truncated (ends with bytes {tail.hex(' ')}, "
            "expected the end marker ff d9)"
        )


def list_train(root, wnids):
    """`(paths, labels)` of the training split, class by class, sorted."""
    paths, labels = [], []
    for label, wnid in enumerate(wnids):
        folder = os.path.join(root, "train", wnid, "images")
        if not os.path.isdir(folder):
            raise DataError(
                f"{folder}: missing (each class folder of "
                "train/ needs an images/ folder)"
            )
        names = sorted(
            name
            for name in os.listdir(folder)
            if name.lower().endswith(_JPEG_SUFFIXES)
        )
        if not names:
            raise DataError(f"{folder}: holds no .JPEG images")
        paths.extend(os.path.join(folder, name) for name in names)
        labels.extend([label] * len(names))
    return paths, labels


def list_val(root, wnids):
    """`(paths, labels)` of the validation split, in annotation-file order."""
    class_to_idx = {wnid: i for i, wnid in enumerate(wnids)}
    annotations = os.path.join(root, "val", "val_annotations.txt")
    if not os.path.isfile(annotations):
        raise DataError(
            f"{annotations}: missing; the validation labels are read from it"
        )
    paths, labels = [], []
    with open(annotations, encoding="utf-8") as stream:
        for line_number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 2:
                raise DataError(
                    f"{annotations}:{line_number}: expected "
                    f"'file<TAB>wnid<TAB>box', got {line!r}"
                )
            name, wnid = fields[0], fields[1]
            if wnid not in class_to_idx:
                raise DataError(
                    f"{annotations}:{line_number}: wnid {wnid} of {name} is "
                    f"not a class folder of {os.path.join(root, 'train')}"
                )
            paths.append(os.path.join(root, "val", "images", name))
            labels.append(class_to_idx[wnid])
    if not paths:
        raise DataError(f"{annotations}: lists no images")
    return paths, labels


def read_words(root, wnids):
    """Names of `wnids` from `root/words.txt`, or `None` without the file.

    A wnid missing from the file keeps its wnid as its name.
    """
    path = os.path.join(root, "words.txt")
    if not os.path.isfile(path):
        return None
    wanted = set(wnids)
    words = {}
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            wnid, _, text = line.rstrip("\n").partition("\t")
            if wnid in wanted:
                words[wnid] = text.strip() or wnid
    return [words.get(wnid, wnid) for wnid in wnids]


def decode_image(element):
    """Reads and decodes one JPEG to uint8 `[64, 64, 3]`.

    `channels=3` turns the grayscale JPEGs of Tiny-ImageNet into RGB. An
    image of another size fails with the path in the message.
    """
    path = element["path"]
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    size_ok = tf.reduce_all(tf.shape(image)[:2] == IMAGE_SIZE)
    check = tf.debugging.Assert(
        size_ok, [path, "is not 64x64 but", tf.shape(image)]
    )
    with tf.control_dependencies([check]):
        image = tf.ensure_shape(image, [IMAGE_SIZE, IMAGE_SIZE, 3])
    return {"image": image, "label": element["label"]}


class FolderSplit(Split):
    """One split of a Tiny-ImageNet root folder, listed and checked once.

    Its classes are the folders of `train/` (a sample may have fewer than
    200). Its table holds paths and labels, a few MB for the 100k training
    images; each image is read and decoded when it is drawn, in parallel
    before batching. Decoded images are not kept: they would hold 1.2 GB
    per pipeline, and decoding keeps ahead of the training step
    (bench/results/input_pipeline.md).
    """

    source = "folder"

    def __init__(self, dataset_name, root, training):
        wnids = class_wnids(root)
        paths, labels = (list_train if training else list_val)(root, wnids)
        for path in paths:
            check_jpeg(path)
        self.paths, self.labels = paths, labels
        super().__init__(
            dataset_name,
            root,
            training,
            num_examples=len(paths),
            num_classes=len(wnids),
            class_names=read_words(root, wnids),
        )

    def table(self):
        return tf.data.Dataset.from_tensors(
            {"path": self.paths, "label": tf.constant(self.labels, tf.int32)}
        )

    def decode_element(self, element):
        return decode_image(element)

"""Writes a folder dataset in Tiny-ImageNet-200's exact layout, of any size.

Behaviour that depends on size (listing, the training order, memory, the
input pipeline's speed) must be checked at the real size, 200 classes of
500 training JPEGs plus 10,000 validation JPEGs, which the 10-class sample
cannot show. This makes such a folder offline:

  python data/make_synthetic_tinyimagenet.py --output_dir=datasets/tiny-200

Layout, as distributed: `wnids.txt`, `words.txt`,
`train/<wnid>/images/<wnid>_<i>.JPEG` with `train/<wnid>/<wnid>_boxes.txt`,
`val/images/val_<k>.JPEG` with `val/val_annotations.txt` (file, wnid, box),
64x64 RGB JPEGs. Each class has a pattern of its own (a coarse random
colour grid) under per-image noise and shifts, so a model can learn it.

`--jpegs_from=DIR` instead cycles through the JPEG files found under DIR
(e.g. the real 10-class sample), so that decoding costs what real images
cost; the labels are then the generated ones, not the images' own.
"""

import argparse
import io
import itertools
import os

import numpy as np
from PIL import Image

SIZE = 64


def _class_pattern(rng):
    """A 64x64x3 float image: a 4x4 random colour grid, blown up."""
    grid = rng.uniform(40, 215, (4, 4, 3))
    return np.kron(grid, np.ones((SIZE // 4, SIZE // 4, 1)))


def _image(pattern, rng):
    """One JPEG of a class: its pattern shifted, with noise."""
    shift = rng.integers(-8, 9, size=2)
    pixels = np.roll(pattern, tuple(shift), axis=(0, 1))
    pixels = pixels + rng.normal(0, 20, pixels.shape)
    pixels = np.clip(pixels, 0, 255).astype(np.uint8)
    stream = io.BytesIO()
    Image.fromarray(pixels).save(stream, format="JPEG", quality=75)
    return stream.getvalue()


def _source_jpegs(folder):
    """Contents of every JPEG under `folder`, sorted by path."""
    paths = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(folder)
        for name in names
        if name.lower().endswith((".jpeg", ".jpg"))
    )
    if not paths:
        raise SystemExit(f"{folder}: holds no .JPEG files")
    contents = []
    for path in paths:
        with open(path, "rb") as stream:
            contents.append(stream.read())
    return contents


def _write(path, content):
    with open(path, "wb") as stream:
        stream.write(content)


def make(output_dir, classes, train_per_class, val_images, seed, jpegs_from):
    """Writes the dataset; returns the wnids in label order."""
    rng = np.random.default_rng(seed)
    wnids = [f"n{9_000_000 + index:08d}" for index in range(classes)]
    patterns = [_class_pattern(rng) for _ in wnids]
    reused = itertools.cycle(_source_jpegs(jpegs_from)) if jpegs_from else None

    def jpeg(label):
        return next(reused) if reused else _image(patterns[label], rng)

    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "wnids.txt"), "w") as stream:
        stream.writelines(f"{wnid}\n" for wnid in wnids)
    with open(os.path.join(output_dir, "words.txt"), "w") as stream:
        stream.writelines(
            f"{wnid}\tgenerated class {index}\n"
            for index, wnid in enumerate(wnids)
        )
    for label, wnid in enumerate(wnids):
        folder = os.path.join(output_dir, "train", wnid, "images")
        os.makedirs(folder, exist_ok=True)
        boxes = []
        for index in range(train_per_class):
            name = f"{wnid}_{index}.JPEG"
            _write(os.path.join(folder, name), jpeg(label))
            boxes.append(f"{name}\t0\t0\t63\t63\n")
        with open(
            os.path.join(output_dir, "train", wnid, f"{wnid}_boxes.txt"), "w"
        ) as stream:
            stream.writelines(boxes)
    val_folder = os.path.join(output_dir, "val", "images")
    os.makedirs(val_folder, exist_ok=True)
    lines = []
    for index in range(val_images):
        label = int(rng.integers(classes))
        name = f"val_{index}.JPEG"
        _write(os.path.join(val_folder, name), jpeg(label))
        lines.append(f"{name}\t{wnids[label]}\t0\t0\t63\t63\n")
    with open(
        os.path.join(output_dir, "val", "val_annotations.txt"), "w"
    ) as stream:
        stream.writelines(lines)
    return wnids


def main():
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--train_per_class", type=int, default=500)
    parser.add_argument("--val_images", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--jpegs_from",
        default="",
        help="Folder whose JPEGs are reused as the images (real decode cost).",
    )
    args = parser.parse_args()
    make(
        args.output_dir,
        args.classes,
        args.train_per_class,
        args.val_images,
        args.seed,
        args.jpegs_from,
    )
    total = args.classes * args.train_per_class
    print(
        f"wrote {total} training and {args.val_images} validation images of "
        f"{args.classes} classes to {args.output_dir}"
    )


if __name__ == "__main__":
    main()

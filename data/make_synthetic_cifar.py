"""Writes a small, learnable 10-class dataset in the CIFAR-10 binary format.

The offline main job needs data without a download. Each image is a shape
(the class) drawn in a random colour, size and position over a noisy,
randomly tinted background, so a model must learn shape, not colour. The
files have exactly the layout of `cifar-10-batches-bin/`: 1 label byte and
3072 pixel bytes (R, G, B planes of 32x32) per record, `data_batch_1..5.bin`,
`test_batch.bin` and `batches.meta.txt`.

  python data/make_synthetic_cifar.py --output_dir=datasets/synthetic
"""

import argparse
import os

import numpy as np

CLASSES = (
    "disc",
    "square",
    "triangle",
    "ring",
    "cross",
    "horizontal_bars",
    "vertical_bars",
    "diagonal",
    "dots",
    "frame",
)
SIZE = 32


def _shape_mask(label, rng):
    """Boolean 32x32 mask of one randomly placed, randomly sized shape."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    radius = rng.uniform(6, 11)
    cy, cx = rng.uniform(radius, SIZE - radius, size=2)
    dy, dx = yy - cy, xx - cx
    inside = (np.abs(dy) <= radius) & (np.abs(dx) <= radius)
    name = CLASSES[label]
    if name == "disc":
        return dy**2 + dx**2 <= radius**2
    if name == "square":
        return inside
    if name == "triangle":
        return inside & (np.abs(dx) <= (dy + radius) / 2)
    if name == "ring":
        dist = np.sqrt(dy**2 + dx**2)
        return (dist <= radius) & (dist >= radius * 0.55)
    if name == "cross":
        arm = radius * 0.3
        return inside & ((np.abs(dy) <= arm) | (np.abs(dx) <= arm))
    if name == "horizontal_bars":
        return inside & (np.floor(dy / 2.5) % 2 == 0)
    if name == "vertical_bars":
        return inside & (np.floor(dx / 2.5) % 2 == 0)
    if name == "diagonal":
        return inside & (np.abs(dy - dx) <= radius * 0.3)
    if name == "dots":
        return (
            inside & (np.floor(dy / 3) % 2 == 0) & (np.floor(dx / 3) % 2 == 0)
        )
    # frame: the outline of a square.
    return inside & (
        (np.abs(dy) >= radius * 0.65) | (np.abs(dx) >= radius * 0.65)
    )


def make_images(count, seed):
    """`count` images `[N, 32, 32, 3]` uint8 and balanced labels `[N]`."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % len(CLASSES)
    rng.shuffle(labels)
    images = np.empty((count, SIZE, SIZE, 3), np.uint8)
    for index, label in enumerate(labels):
        background = rng.uniform(0, 255, size=3)
        noise = rng.normal(0, 25, size=(SIZE, SIZE, 3))
        image = np.clip(background + noise, 0, 255)
        colour = rng.uniform(0, 255, size=3)
        # Keep the shape visible: push its colour away from the background.
        colour = np.where(
            np.abs(colour - background) < 60, 255 - background, colour
        )
        image[_shape_mask(label, rng)] = colour
        images[index] = image.astype(np.uint8)
    return images, labels.astype(np.uint8)


def to_records(images, labels):
    """CIFAR-10 binary records: label byte, then R, G, B planes."""
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    return np.concatenate([labels[:, None], planes], axis=1).tobytes()


def write_dataset(output_dir, train_per_batch=1000, test_count=1000, seed=0):
    """Writes the dataset; returns the folder holding the batch files."""
    folder = os.path.join(output_dir, "cifar-10-batches-bin")
    os.makedirs(folder, exist_ok=True)
    splits = [(f"data_batch_{i}.bin", train_per_batch) for i in range(1, 6)]
    splits.append(("test_batch.bin", test_count))
    for offset, (name, count) in enumerate(splits):
        images, labels = make_images(count, seed * 100 + offset)
        tmp_path = os.path.join(folder, f".{name}.tmp")
        with open(tmp_path, "wb") as stream:
            stream.write(to_records(images, labels))
        os.replace(tmp_path, os.path.join(folder, name))
    with open(os.path.join(folder, "batches.meta.txt"), "w") as stream:
        stream.write("\n".join(CLASSES) + "\n")
    return folder


def main():
    """Command line: writes the dataset where --output_dir says."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="datasets/synthetic")
    parser.add_argument("--train_per_batch", type=int, default=1000)
    parser.add_argument("--test_count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = write_dataset(
        args.output_dir, args.train_per_batch, args.test_count, args.seed
    )
    print(
        f"wrote {5 * args.train_per_batch} train and {args.test_count} test "
        f"images to {folder}"
    )


if __name__ == "__main__":
    main()

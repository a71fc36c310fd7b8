"""Which classes the training batches hold, on an image folder of any size.

  .venv/bin/python bench/training_order.py --folder=datasets/tiny-200

An image folder is listed class by class. The table compares, for one epoch
of that listing at batch 128, what uniform sampling gives, what a
10,000-element `tf.data` shuffle buffer over the listing gives (this
project's pipeline before every epoch became a permutation of the whole
split), and the order our pipeline reads now (`pipeline.training_order`,
checked against the labels of the first batch the real pipeline decodes).
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def uniform_distinct(classes, draws):
    """Expected distinct classes among `draws` uniform draws."""
    return classes * (1 - (1 - 1 / classes) ** draws)


def one_epoch(dataset, count):
    """The first `count` elements of `dataset`, as one array."""
    return next(dataset.take(count).batch(count).as_numpy_iterator())


def describe(order, batch, classes):
    """The table's cells for one epoch's labels in reading order."""
    batches = order[: len(order) // batch * batch].reshape(-1, batch)
    seen, until_all = set(), None
    for index, labels in enumerate(batches):
        seen.update(labels.tolist())
        if len(seen) == classes:
            until_all = index + 1
            break
    quarter = order[: len(order) // 4]
    return [
        str(len(set(batches[0].tolist()))),
        str(len(set(batches[min(49, len(batches) - 1)].tolist()))),
        str(len(set(batches[:200].ravel().tolist()))),
        str(len(set(quarter.tolist()))),
        str(until_all),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", default=common.TINYIMAGENET_DIR)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--buffer", type=int, default=10_000)
    args = parser.parse_args()

    import tensorflow as tf

    from tf_resnet import data
    from tf_resnet.data import pipeline

    common.print_environment("classes in the training batches")
    split = data.open_split("tinyimagenet", args.folder, training=True)
    labels = np.array(split.labels)
    count, classes = split.num_examples, split.num_classes
    options = data.InputOptions(seed=args.seed)
    ours = one_epoch(pipeline.training_order(count, args.batch, options), count)
    _, first = next(iter(split.dataset(args.batch, options)))
    np.testing.assert_array_equal(first.numpy(), labels[ours[: args.batch]])
    buffered = one_epoch(
        tf.data.Dataset.from_tensor_slices(labels).shuffle(
            args.buffer, seed=args.seed
        ),
        count,
    )
    draws_quarter = count // 4
    expected = [
        f"{uniform_distinct(classes, args.batch):.1f}",
        f"{uniform_distinct(classes, args.batch):.1f}",
        f"{uniform_distinct(classes, 200 * args.batch):.1f}",
        f"{uniform_distinct(classes, draws_quarter):.1f}",
        "-",
    ]
    rows = [
        ["uniform draws (expected)", *expected],
        [f"shuffle buffer of {args.buffer} (before)", *describe(
            buffered, args.batch, classes
        )],
        ["permutation of the split (now)", *describe(
            labels[ours], args.batch, classes
        )],
    ]  # fmt: skip
    common.print_table(
        f"{args.folder}: {count} training images, {classes} classes, "
        f"batch {args.batch}, seed {args.seed}",
        [
            "order",
            "classes in batch 1",
            "in batch 50",
            "in batches 1-200",
            "in the first quarter epoch",
            "batches until every class",
        ],
        rows,
    )


if __name__ == "__main__":
    main()

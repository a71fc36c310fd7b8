"""The per-class report of an evaluation, written to the eval dir.

Accuracy alone hides which classes a model mixes up; these files show it,
rewritten (atomically) after every evaluation, so they always describe the
latest one:

* `confusion_matrix.csv`: counts, a row per true class and a column per
  predicted class, headed by the class names.
* `per_class.csv`: each class's examples, correct predictions, accuracy
  and the class it is most often mistaken for.
* `confusion_matrix.png`: the matrix as an image, each row shaded by the
  fraction of that class's examples. Beyond `MAX_PLOTTED_CLASSES` classes a
  full grid is unreadable, so it shows the classes most involved in
  confusions instead.
"""

import csv
import io
import os

import numpy as np

from tf_resnet import summaries

CONFUSION_CSV = "confusion_matrix.csv"
CONFUSION_PNG = "confusion_matrix.png"
PER_CLASS_CSV = "per_class.csv"
PER_CLASS_FIELDS = (
    "class",
    "name",
    "examples",
    "correct",
    "accuracy",
    "most_confused_with",
    "confused_count",
)
MAX_PLOTTED_CLASSES = 20


def class_labels(names, num_classes):
    """Names for the axes: `names` if it fits the matrix, else the indices."""
    if names is None or len(names) != num_classes:
        return [str(index) for index in range(num_classes)]
    return [str(name) for name in names]


def per_class_rows(confusion, labels):
    """The rows of `per_class.csv`, from the confusion matrix."""
    for index, row in enumerate(confusion):
        examples = int(row.sum())
        correct = int(row[index])
        mistakes = row.copy()
        mistakes[index] = 0
        worst = int(np.argmax(mistakes))
        yield {
            "class": index,
            "name": labels[index],
            "examples": examples,
            "correct": correct,
            "accuracy": f"{correct / examples:.6f}" if examples else "",
            "most_confused_with": labels[worst] if mistakes[worst] else "",
            "confused_count": int(mistakes[worst]),
        }


def most_confused(confusion, limit=MAX_PLOTTED_CLASSES):
    """Indices (ascending) of the `limit` classes most involved in errors.

    A class's score is its examples predicted as another class plus other
    classes' examples predicted as it; ties go to the lower index.
    """
    if len(confusion) <= limit:
        return np.arange(len(confusion))
    mistakes = confusion.copy()
    np.fill_diagonal(mistakes, 0)
    score = mistakes.sum(axis=0) + mistakes.sum(axis=1)
    return np.sort(np.argsort(-score, kind="stable")[:limit])


def draw_confusion(confusion, labels, step):
    """The PNG (bytes) of the confusion matrix, or of its most confused part.

    Colour is the fraction of the true class's examples (its whole row, also
    when only some columns are shown); each non-zero cell shows its count.
    """
    from matplotlib.figure import Figure  # Only the chief draws.

    shown = most_confused(confusion)
    matrix = confusion[np.ix_(shown, shown)]
    examples = np.maximum(confusion[shown].sum(axis=1), 1)
    fraction = matrix / examples[:, None]
    count = len(shown)
    size = 2.5 + 0.4 * count
    figure = Figure(figsize=(size, size), dpi=100)
    axes = figure.subplots()
    axes.imshow(fraction, cmap="Blues", vmin=0.0, vmax=1.0)
    names = [labels[index] for index in shown]
    axes.set_xticks(range(count), names, rotation=90, fontsize=8)
    axes.set_yticks(range(count), names, fontsize=8)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    for row, column in zip(*np.nonzero(matrix), strict=True):
        axes.text(
            column,
            row,
            str(matrix[row, column]),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if fraction[row, column] > 0.5 else "black",
        )
    title = f"confusion matrix at step {step}"
    if count < len(confusion):
        title += f"\nthe {count} of {len(confusion)} classes most confused"
    axes.set_title(title, fontsize=10)
    figure.tight_layout()
    stream = io.BytesIO()
    figure.savefig(stream, format="png")
    return stream.getvalue()


def write_report(directory, step, confusion, names=None):
    """Writes the three report files into `directory`; returns the PNG bytes.

    Args:
      directory: the eval dir (created if missing).
      step: the training step evaluated (in the image's title).
      confusion: int `[classes, classes]`, rows true, columns predicted.
      names: class names by index, or `None` for the indices.
    """
    os.makedirs(directory, exist_ok=True)
    labels = class_labels(names, len(confusion))

    def write_matrix(stream):
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(["true \\ predicted", *labels])
        for label, row in zip(labels, confusion, strict=True):
            writer.writerow([label, *(int(value) for value in row)])

    def write_per_class(stream):
        writer = csv.DictWriter(stream, PER_CLASS_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(per_class_rows(confusion, labels))

    summaries.atomic_write(os.path.join(directory, CONFUSION_CSV), write_matrix)
    summaries.atomic_write(
        os.path.join(directory, PER_CLASS_CSV), write_per_class
    )
    image = draw_confusion(confusion, labels, step)
    summaries.atomic_write(
        os.path.join(directory, CONFUSION_PNG),
        lambda stream: stream.write(image),
        mode="wb",
    )
    return image

"""What a run leaves for people to read: TensorBoard events, a CSV, a plot.

* `train_dir`: loss, accuracy, learning rate, images/sec (TensorBoard).
* `eval_dir`: `Precision` and `Best Precision`, the tags of the original
  example, plus `Precision@5`, the evaluation loss and the confusion-matrix
  image (TensorBoard).
* `log_root`: the run's flags for TensorBoard's HParams dashboard, so
  `tensorboard --logdir=runs/` compares runs in one table.
* `eval.csv` and `learning_curve.png`: the learning curve as courses
  draw it, accuracy and loss by epoch of the training batches beside the
  evaluation split's (named as the dataset names it: `test`, `val`), one
  row per evaluation, rewritten atomically after each, so a killed run
  never leaves a half-written file; the training run's in `log_root`, the
  eval job's in its `eval_dir`.
"""

import csv
import json
import os
import tempfile

import tensorflow as tf

EVAL_CSV = "eval.csv"
LEARNING_CURVE_PNG = "learning_curve.png"
# `precision` and `loss` are the evaluation split's (named in `split`);
# `train_accuracy` and `train_loss` the mean over the training batches
# since the evaluation before, as Keras' `History` reports an epoch's. New
# columns go last: readers (setup.sh, earlier runs' files) go by name.
CSV_FIELDS = (
    "step",
    "epoch",
    "precision",
    "best_precision",
    "loss",
    "precision_at_5",
    "train_accuracy",
    "train_loss",
    "split",
    "examples",
)
# The loss panel's axis stops at this multiple of the largest training loss
# (of the split's median loss where there is no training column): an early
# evaluation's loss can be 10^4-10^8 while the model's batch-norm moving
# statistics lag its weights (docs/recipes.md, "The first evaluations"),
# and a linear axis up to there flattens every other point. The points
# above it are drawn on its top edge, marked and labelled with their value.
LOSS_AXIS_FACTOR = 3.0


class ScalarWriter:
    """A TensorBoard writer of scalars; a no-op on non-chief workers."""

    def __init__(self, logdir, is_chief=True):
        if is_chief:
            self.writer = tf.summary.create_file_writer(logdir)
        else:
            self.writer = tf.summary.create_noop_writer()

    def write(self, step, scalars):
        with self.writer.as_default():
            for name, value in scalars.items():
                tf.summary.scalar(name, value, step=step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class EvalWriter(ScalarWriter):
    """Evaluation events, with the tags of the original example."""

    def write(self, step, result, best_precision, confusion_png=None):
        """Writes the scalars of `result` and the confusion-matrix image.

        Args:
          step: the training step evaluated.
          result: from `evaluation.evaluate`.
          best_precision: the best precision so far.
          confusion_png: PNG bytes of the confusion matrix, or None.
        """
        super().write(
            step,
            {
                "Precision": result["precision"],
                "Best Precision": best_precision,
                "Precision@5": result["precision_at_5"],
                "loss": result["loss"],
            },
        )
        if confusion_png is not None:
            image = tf.image.decode_png(confusion_png, channels=3)
            with self.writer.as_default():
                tf.summary.image("confusion_matrix", image[None], step=step)
            self.writer.flush()


def hparam_value(value):
    """A config value as the HParams plugin takes it (bool, number, str)."""
    if isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value)  # None, tuples: readable and comparable.


def write_hparams(logdir, values):
    """Logs `{name: value}` (the flattened config) for the HParams plugin.

    Written to the run's `log_root`, the parent of its `train/` and `eval/`
    event directories, so the dashboard's table shows their scalars (such as
    `eval/Precision`) next to the flags.
    """
    from tensorboard.plugins.hparams import api as hparams_api

    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        hparams_api.hparams(
            {name: hparam_value(value) for name, value in values.items()}
        )
    writer.close()


def atomic_write(path, write_fn, mode="w"):
    """Writes a file through a temporary file and a rename.

    A crash or a full disk leaves the previous version intact.
    """
    directory = os.path.dirname(os.path.abspath(path))
    handle, tmp_path = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(handle, mode) as stream:
            write_fn(stream)
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, path)
    except BaseException:
        os.unlink(tmp_path)
        raise


class EvalHistory:
    """Evaluation results by step, kept in `directory/eval.csv`.

    Loads earlier results, so a resumed run (or a restarted eval job) keeps
    the whole curve and the best precision so far. Each source of results
    (the training run, an eval job) has its own directory and files, so
    running them side by side never erases the other's rows; the plot also
    draws the curves of `compare` (read-only) as lines of their own.
    """

    def __init__(
        self, directory, title="", label="", compare=None, split="test"
    ):
        """Loads `directory/eval.csv` if there is one.

        Args:
          directory: where `eval.csv` and `learning_curve.png` are written.
          title: of the plot.
          label: this source's lines in the plot's legend.
          compare: `{label: path of another eval.csv}` to draw as well.
          split: the evaluation split's name (`test`, TinyImageNet's `val`).
        """
        self.directory = directory
        self.csv_path = os.path.join(directory, EVAL_CSV)
        self.png_path = os.path.join(directory, LEARNING_CURVE_PNG)
        self.title = title
        self.label = label
        self.compare = compare or {}
        self.split = split
        self.rows = read_eval_csv(self.csv_path)

    @property
    def best_precision(self):
        return max(
            (float(r["precision"]) for r in self.rows.values()), default=0.0
        )

    def record(
        self,
        step,
        epoch,
        precision,
        loss,
        precision_at_5=None,
        train=None,
        examples=None,
    ):
        """Adds (or replaces) the result at `step`; returns the best so far.

        `train`: `{"accuracy", "loss"}` over the training batches since the
        evaluation before, if known (not to an eval job without training's
        row of that step, nor after a resume for the batches before it).
        `examples`: the images evaluated, fewer than the split's where
        `--eval_batch_count` cut the evaluation short.
        """
        best = max(self.best_precision, precision)
        train = train or {}
        self.rows[step] = {
            "step": step,
            "epoch": f"{epoch:.4f}",
            "precision": f"{precision:.6f}",
            "best_precision": f"{best:.6f}",
            "loss": f"{loss:.6f}",
            "precision_at_5": _number(precision_at_5),
            "train_accuracy": _number(train.get("accuracy")),
            "train_loss": _number(train.get("loss")),
            "split": self.split,
            "examples": "" if examples is None else str(int(examples)),
        }
        os.makedirs(self.directory, exist_ok=True)
        atomic_write(self.csv_path, self._write_csv)
        self._plot()
        return best

    def _write_csv(self, stream):
        writer = csv.DictWriter(
            stream, CSV_FIELDS, lineterminator="\n", extrasaction="ignore"
        )
        writer.writeheader()
        for step in sorted(self.rows):
            writer.writerow(self.rows[step])

    def training_row(self, step):
        """`{"accuracy", "loss"}` of training at `step`, from `compare`.

        For the eval job, whose checkpoints are training's: the training
        run's own row of that step, if it evaluated there.
        """
        for path in self.compare.values():
            try:
                row = read_eval_csv(path).get(step)
            except (OSError, ValueError, KeyError, csv.Error):
                continue
            if row and row.get("train_accuracy"):
                return {
                    "accuracy": float(row["train_accuracy"]),
                    "loss": float(row["train_loss"]),
                }
        return None

    def _plot(self):
        figure = self.figure()
        atomic_write(
            self.png_path, lambda s: figure.savefig(s, format="png"), mode="wb"
        )

    def figure(self):
        """Accuracy and loss by epoch: each source's split and training.

        The split's points are solid lines with dots, training's dashed;
        this history's own points are drawn last with a marker of their
        own, so an eval job's show on top of training's identical ones (its
        training columns, copies of training's rows, are drawn as those).
        """
        from matplotlib.figure import Figure

        figure = Figure(figsize=(10, 4), dpi=100)
        accuracy, loss = figure.subplots(1, 2)
        sources = {}
        for label, path in self.compare.items():
            try:
                sources[label] = read_eval_csv(path)
            except (OSError, ValueError, KeyError, csv.Error):
                continue  # Being replaced, or not a curve: drawn next time.
        sources[self.label] = self.rows
        own = self.label
        sources = {
            label: [rows[step] for step in sorted(rows)]
            for label, rows in sources.items()
        }
        top = loss_axis_top(sources.values())
        for label, rows in sources.items():
            if not rows:
                continue
            name = f"{label} " if len(sources) > 1 and label else ""
            split = rows[-1].get("split") or self.split
            mine = label == own and len(sources) > 1
            style = {
                "marker": "D" if mine else "o",
                "markersize": 6 if mine else 3,
                "zorder": 3 if mine else 2,
            }
            for axes, column, scale, limit in (
                (accuracy, "precision", 100, None),
                (loss, "loss", 1, top),
            ):
                epochs, values = _series(rows, column, scale)
                line = axes.plot(
                    epochs,
                    _clipped(axes, epochs, values, limit),
                    label=f"{name}{split}",
                    **style,
                )[0]
                train = (
                    "train_accuracy" if column == "precision" else "train_loss"
                )
                epochs, values = _series(rows, train, scale)
                if values and not mine:  # Copies of training's: drawn there.
                    axes.plot(
                        epochs,
                        _clipped(axes, epochs, values, limit),
                        linestyle="--",
                        # A colour per source; alone, one per split.
                        color=line.get_color() if len(sources) > 1 else None,
                        label=f"{name}train",
                        **style,
                    )
        accuracy.set_ylabel("accuracy (%)")
        loss.set_ylabel("loss (cross-entropy)")
        if top is not None:
            loss.set_ylim(0, top * 1.1)  # Room for the marks on the edge.
            loss.set_title(
                f"points above {top:.3g} drawn at the top (^), with their "
                "value",
                fontsize="small",
            )
        for axes in (accuracy, loss):
            axes.set_xlabel("epoch")
            axes.grid(alpha=0.3)
            if axes.lines:
                axes.legend(fontsize="small")
        figure.suptitle(self.title or "learning curve")
        figure.tight_layout()
        return figure


def loss_axis_top(sources):
    """The loss axis's top where some points would flatten the rest, or None.

    `sources`: each source's rows. The top is `LOSS_AXIS_FACTOR` times the
    largest training loss (the median split loss where no row has one);
    None when every loss is below it (the axis then fits them all).
    """
    rows = [row for source in sources for row in source]
    training = _series(rows, "train_loss", 1)[1]
    split = sorted(_series(rows, "loss", 1)[1])
    if not split:
        return None
    reference = max(training) if training else split[len(split) // 2]
    top = LOSS_AXIS_FACTOR * reference
    return top if max(split + training) > top else None


def _clipped(axes, epochs, values, top):
    """`values` with those above `top` left out, each marked and labelled.

    Each is a mark on the axis's top edge with its value beside it, a
    scatter and texts, not lines, so the panel's lines stay one per curve
    (its legend's); the curve has a gap there, not a point at a false value.
    """
    if top is None:
        return values
    above = [(e, v) for e, v in zip(epochs, values, strict=True) if v > top]
    if above:
        axes.scatter(
            [e for e, _ in above], [top] * len(above), marker="^", color="red"
        )
        for epoch, value in above:
            axes.annotate(
                f"{value:.3g}",
                (epoch, top),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize="x-small",
                color="red",
            )
    return [v if v <= top else float("nan") for v in values]


def _number(value):
    """A CSV cell: six decimals, or empty when the value is unknown."""
    return "" if value is None else f"{value:.6f}"


def _series(rows, column, scale):
    """`(epochs, values)` of the rows that have `column` (old files lack it)."""
    points = [
        (float(row["epoch"]), scale * float(row[column]))
        for row in rows
        if row.get(column)
    ]
    return [e for e, _ in points], [v for _, v in points]


def read_eval_csv(path):
    """`{step: row}` of an `eval.csv`; empty if the file does not exist."""
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as stream:
        return {int(row["step"]): row for row in csv.DictReader(stream)}

"""What a run leaves for people to read: TensorBoard events, a CSV, a plot.

* `train_dir`: loss, accuracy, learning rate, images/sec (TensorBoard).
* `eval_dir`: `Precision` and `Best Precision`, the tags of the original
  example, plus `Precision@5`, the evaluation loss and the confusion-matrix
  image (TensorBoard).
* `log_root`: the run's flags for TensorBoard's HParams dashboard, so
  `tensorboard --logdir=runs/` compares runs in one table.
* `eval.csv` and `learning_curve.png`: test accuracy vs epoch, rewritten
  atomically after every evaluation, so a killed run never leaves a
  half-written file; the training run's in `log_root`, the eval job's in
  its `eval_dir`.
"""

import csv
import json
import os
import tempfile

import tensorflow as tf

EVAL_CSV = "eval.csv"
LEARNING_CURVE_PNG = "learning_curve.png"
CSV_FIELDS = (
    "step",
    "epoch",
    "precision",
    "best_precision",
    "loss",
    "precision_at_5",
)


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

    def __init__(self, directory, title="", label="", compare=None):
        """Loads `directory/eval.csv` if there is one.

        Args:
          directory: where `eval.csv` and `learning_curve.png` are written.
          title: of the plot.
          label: this source's line in the plot's legend.
          compare: `{label: path of another eval.csv}` to draw as well.
        """
        self.directory = directory
        self.csv_path = os.path.join(directory, EVAL_CSV)
        self.png_path = os.path.join(directory, LEARNING_CURVE_PNG)
        self.title = title
        self.label = label
        self.compare = compare or {}
        self.rows = read_eval_csv(self.csv_path)

    @property
    def best_precision(self):
        return max(
            (float(r["precision"]) for r in self.rows.values()), default=0.0
        )

    def record(self, step, epoch, precision, loss, precision_at_5=None):
        """Adds (or replaces) the result at `step`; returns the best so far."""
        best = max(self.best_precision, precision)
        self.rows[step] = {
            "step": step,
            "epoch": f"{epoch:.4f}",
            "precision": f"{precision:.6f}",
            "best_precision": f"{best:.6f}",
            "loss": f"{loss:.6f}",
            "precision_at_5": (
                "" if precision_at_5 is None else f"{precision_at_5:.6f}"
            ),
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

    def _plot(self):
        from matplotlib.figure import Figure

        figure = Figure(figsize=(6, 4), dpi=100)
        axes = figure.subplots()
        sources = {self.label: self.rows}
        for label, path in self.compare.items():
            try:
                sources[label] = read_eval_csv(path)
            except (OSError, ValueError, KeyError, csv.Error):
                continue  # Being replaced, or not a curve: drawn next time.
        for label, rows in sources.items():
            rows = [rows[step] for step in sorted(rows)]
            if rows:
                axes.plot(
                    [float(r["epoch"]) for r in rows],
                    [100 * float(r["precision"]) for r in rows],
                    marker="o",
                    markersize=3,
                    label=label or None,
                )
        axes.set_xlabel("epoch")
        axes.set_ylabel("test accuracy (%)")
        axes.set_title(self.title or "learning curve")
        axes.grid(alpha=0.3)
        if len(sources) > 1:
            axes.legend()
        figure.tight_layout()
        atomic_write(
            self.png_path, lambda s: figure.savefig(s, format="png"), mode="wb"
        )


def read_eval_csv(path):
    """`{step: row}` of an `eval.csv`; empty if the file does not exist."""
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as stream:
        return {int(row["step"]): row for row in csv.DictReader(stream)}

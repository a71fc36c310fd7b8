"""What a run leaves for people to read: TensorBoard events, a CSV, a plot.

* `train_dir`: loss, accuracy, learning rate, images/sec (TensorBoard).
* `eval_dir`: `Precision` and `Best Precision`, the tags of the original
  example, plus the evaluation loss (TensorBoard).
* `log_root/eval.csv` and `log_root/learning_curve.png`: test accuracy vs
  epoch, rewritten atomically after every evaluation, so a killed run never
  leaves a half-written file.
"""

import csv
import os
import tempfile

import tensorflow as tf

CSV_FIELDS = ("step", "epoch", "precision", "best_precision", "loss")


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

    def write(self, step, result, best_precision):
        super().write(
            step,
            {
                "Precision": result["precision"],
                "Best Precision": best_precision,
                "loss": result["loss"],
            },
        )


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
    """Evaluation results by step, kept in `log_root/eval.csv`.

    Loads earlier results, so a resumed run (or a separate `--mode=eval`
    process) keeps the whole curve and the best precision so far.
    """

    def __init__(self, log_root, title=""):
        self.csv_path = os.path.join(log_root, "eval.csv")
        self.png_path = os.path.join(log_root, "learning_curve.png")
        self.title = title
        self.rows = {}
        if os.path.exists(self.csv_path):
            with open(self.csv_path, newline="") as stream:
                for row in csv.DictReader(stream):
                    self.rows[int(row["step"])] = row

    @property
    def best_precision(self):
        return max(
            (float(r["precision"]) for r in self.rows.values()), default=0.0
        )

    def record(self, step, epoch, precision, loss):
        """Adds (or replaces) the result at `step`; returns the best so far."""
        best = max(self.best_precision, precision)
        self.rows[step] = {
            "step": step,
            "epoch": f"{epoch:.4f}",
            "precision": f"{precision:.6f}",
            "best_precision": f"{best:.6f}",
            "loss": f"{loss:.6f}",
        }
        atomic_write(self.csv_path, self._write_csv)
        self._plot()
        return best

    def _write_csv(self, stream):
        writer = csv.DictWriter(stream, CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for step in sorted(self.rows):
            writer.writerow(self.rows[step])

    def _plot(self):
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot

        rows = [self.rows[step] for step in sorted(self.rows)]
        figure, axes = pyplot.subplots(figsize=(6, 4), dpi=100)
        axes.plot(
            [float(r["epoch"]) for r in rows],
            [100 * float(r["precision"]) for r in rows],
            marker="o",
            markersize=3,
        )
        axes.set_xlabel("epoch")
        axes.set_ylabel("test accuracy (%)")
        axes.set_title(self.title or "learning curve")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        atomic_write(
            self.png_path, lambda s: figure.savefig(s, format="png"), mode="wb"
        )
        pyplot.close(figure)

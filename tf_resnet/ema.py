"""Exponential moving average (EMA) of a model's weights, for evaluation.

Averaging the weights of the last few hundred steps smooths out the noise of
SGD at a high learning rate, so a short run evaluates like a longer one
(Polyak averaging; the `ModelEma` of timm). The average covers every
floating-point variable of the model: trainable weights AND the BatchNorm
moving statistics, so the averaged network normalises with statistics that
match its averaged weights.

The shadow variables are plain `tf.Variable`s, created in the model's
distribution scope when one is given, and tracked by name (the Keras
variable path), so `tf.train.Checkpoint(model=..., ema=ema)` saves and
restores them with the model. Typical use:

    ema = ExponentialMovingAverage(model, 0.999, scope=distributor.scope())
    ...in the train step, after `apply_gradients`: ema.update()
    with ema.swapped():  # evaluation or export with averaged weights
        evaluate(model)

Decay warm-up: the average starts from the initial (random) weights, and
with a constant decay `d` after `n` updates they still weigh `d**n` in it
(0.999 ** 1000 = 37%), which ruins short runs. With `warmup=True` update
`n` (0-based) uses `min(decay, (1 + n) / (10 + n))`, timm's and TF's
`num_updates` rule: the early average follows the weights closely and the
full decay applies after about `9 / (1 - decay)` updates.
"""

import contextlib

import tensorflow as tf


class ExponentialMovingAverage(tf.Module):
    """Shadow copies of a model's floating-point variables.

    Args:
      model: the Keras model; its float variables at construction are the
        starting average (call after building and before training, or after
        restoring the model).
      decay: the average's decay per update, e.g. 0.999.
      warmup: use `min(decay, (1 + n) / (10 + n))` at update `n`.
      scope: context manager to create the variables in (e.g. the
        distributor's `scope()`); `None`: the current one.
    """

    # The model's own variables are neither this module's `variables` nor
    # its checkpoint dependencies: the model saves them itself.
    _TF_MODULE_IGNORED_PROPERTIES = frozenset(
        ("_model_variables", *tf.Module._TF_MODULE_IGNORED_PROPERTIES)
    )

    def __init__(self, model, decay, warmup=True, scope=None):
        super().__init__(name="ema")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self._set_model_variables(
            [v for v in model.weights if tf.as_dtype(v.dtype).is_floating]
        )
        # Replicas hold identical model variables after a synchronous step,
        # so the first replica's update of the average stands for all (no
        # cross-replica reduction per step).
        first = tf.VariableAggregation.ONLY_FIRST_REPLICA
        with scope or contextlib.nullcontext():
            self.num_updates = tf.Variable(
                0, dtype=tf.int64, trainable=False, aggregation=first
            )
            self.averages = {
                v.path: tf.Variable(
                    tf.convert_to_tensor(v),
                    trainable=False,
                    name=v.path.replace("/", "_") + "_ema",
                    aggregation=first,
                )
                for v in self._model_variables
            }
        if len(self.averages) != len(self._model_variables):
            raise ValueError(
                f"model {model.name!r} has variables sharing a path; the "
                "average is kept by path"
            )

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _set_model_variables(self, variables):
        self._model_variables = variables

    @property
    def pairs(self):
        """`(model variable, its average)` for every averaged variable."""
        return [(v, self.averages[v.path]) for v in self._model_variables]

    def current_decay(self):
        """The decay the next `update()` applies (float32 tensor)."""
        if not self.warmup:
            return tf.constant(self.decay, tf.float32)
        n = tf.cast(self.num_updates, tf.float32)
        return tf.minimum(self.decay, (1.0 + n) / (10.0 + n))

    def update(self):
        """`average -= (1 - decay) * (average - value)` for every variable.

        Works eagerly and inside a `tf.function` train step (call it after
        the optimizer's update); returns one op grouping the assignments.
        """
        decay = self.current_decay()
        updates = []
        for variable, average in self.pairs:
            rate = tf.cast(1.0 - decay, average.dtype)
            value = tf.cast(tf.convert_to_tensor(variable), average.dtype)
            updates.append(average.assign_sub(rate * (average - value)))
        with tf.control_dependencies(updates):
            return tf.group(self.num_updates.assign_add(1))

    def swap(self):
        """Exchanges the model's values with the averages (self-inverse)."""
        for variable, average in self.pairs:
            value = tf.identity(tf.convert_to_tensor(variable))
            variable.assign(tf.cast(average, variable.dtype))
            average.assign(tf.cast(value, average.dtype))

    @contextlib.contextmanager
    def swapped(self):
        """The model holds the averages inside the block, its own after.

        Do not save a checkpoint inside the block: it would store the
        averages as the model's weights and the raw weights as the EMA.
        """
        self.swap()
        try:
            yield self
        finally:
            self.swap()

    def copy_to(self, model):
        """Assigns the averages to `model`'s variables, by variable path.

        `model` may be this EMA's own model (to keep the averaged weights
        for good, e.g. before export) or another instance of the same
        architecture.
        """
        targets = {
            v.path: v for v in model.weights if tf.as_dtype(v.dtype).is_floating
        }
        if set(targets) != set(self.averages):
            missing = sorted(set(self.averages) ^ set(targets))[:5]
            raise ValueError(
                f"model {model.name!r} does not match the averaged model: "
                f"variables differ, e.g. {', '.join(missing)}"
            )
        for path, average in self.averages.items():
            target = targets[path]
            target.assign(tf.cast(average, target.dtype))

"""A run's configuration from its layers, and the `config.json` it keeps.

Values are layered, each layer winning over the ones before it:

  field defaults < `--recipe` < `--preset` < the run's saved
  `config.json` < flags given on the command line.

The saved layer is what lets a resumed run, the separate `--mode=eval` job
and export read the run's own settings instead of re-deriving them: only
the groups that define the model and its training (`settings.CARRIED`) are
taken from it; where this process runs and what it does now are its own.

The settings themselves are declared in `settings`, checked in
`validation`. This module imports no TensorFlow either.
"""

import dataclasses
import json
import os
import shlex

from tf_resnet.config import presets
from tf_resnet.config.settings import (
    CARRIED,
    GROUPS,
    TOP_LEVEL,
    RunConfig,
    flatten,
    make_config,
)
from tf_resnet.config.validation import validate
from tf_resnet.errors import UserInputError

CONFIG_FILE = "config.json"


def resolve(values, explicit):
    """Layers presets, the saved config and explicit flags; validates.

    Args:
      values: `{field name: value}` of every field, as the flags hold them
        (defaults where not given).
      explicit: names given on the command line; they win over every layer.

    Returns:
      A validated `Config`.

    Raises:
      UserInputError: an unknown preset, an unreadable saved config, or
        contradictory or out-of-range values, as one message.
    """
    config = make_config(**_layered(values, explicit, with_saved=True))
    validate(config)
    return config


def taken_from_saved(values, explicit):
    """`{name: value}` of the settings the run's `config.json` decided.

    Those whose value differs from what the flags, presets and recipes
    alone give: a run that reads them says so at its start, so a setting
    it did not ask for (another run's `--dataset`) cannot pass unseen.
    """
    own = _layered(values, explicit, with_saved=False)
    layered = _layered(values, explicit, with_saved=True)
    return {
        name: value
        for name, value in layered.items()
        if name not in explicit and _comparable(value) != _comparable(own[name])
    }


def _comparable(value):
    """A list as the tuple it is saved from: `[0.5, 0.75]` is the default."""
    return tuple(value) if isinstance(value, list) else value


def _layered(values, explicit, with_saved):
    """`values` with each layer applied, the saved config's if `with_saved`."""
    values = dict(values)
    layers = []
    preset = values.get("preset")
    if preset:
        if preset not in presets.PRESETS:
            raise UserInputError(
                f"unknown --preset={preset}; known: "
                f"{', '.join(presets.PRESETS)}"
            )
        layers.append(presets.PRESETS[preset])
    saved = None
    if with_saved:
        log_root = values.get("log_root") or RunConfig.log_root
        saved = load_saved(log_root)
    if saved is not None:
        _refuse_another_run(log_root, saved, values, explicit)
        layers.append({k: v for k, v in saved.items() if k in CARRIED})
    # The recipe is a layer under all others; which one is itself layered.
    recipe = values.get("recipe") or "paper"
    if "recipe" not in explicit:
        for layer in layers:
            recipe = layer.get("recipe", recipe)
    if recipe not in presets.RECIPES:
        raise UserInputError(
            f"unknown --recipe={recipe}; known: {', '.join(presets.RECIPES)}"
        )
    layers.insert(0, {**presets.RECIPES[recipe], "recipe": recipe})
    for layer in layers:
        for name, value in layer.items():
            if name not in explicit:
                values[name] = value
    return values


def _refuse_another_run(log_root, saved, values, explicit):
    """Refuses a command that asks for another run than `log_root` holds.

    The saved config wins over `--preset` (a resumed run keeps its
    settings), so a folder that holds a `cifar100` run, given to a
    `--preset=course_tinyimagenet` command, would take the saved dataset
    and then blame the data. A command that names its preset or dataset,
    and a run of another one, are two runs: that is said first, with both
    ways on.

    Raises:
      UserInputError: the given `--preset` or the dataset the command asks
        for (`--dataset`, else its preset's) is not the saved run's.
    """
    preset = values.get("preset") if "preset" in explicit else None
    asked = {}
    if preset:
        asked["preset"] = preset
    dataset = (
        values.get("dataset")
        if "dataset" in explicit
        else presets.PRESETS.get(preset, {}).get("dataset")
    )
    if dataset:
        asked["dataset"] = dataset
    if all(saved.get(k) in (v, None) for k, v in asked.items()):
        return
    own = [f"--preset={saved['preset']}"] if saved.get("preset") else []
    own += [
        shlex.quote(f"--{name}={saved[name]}")
        for name in ("train_data_path", "eval_data_path")
        if saved.get(name)
    ]
    wanted = (
        f"--preset={preset} ({dataset})" if preset else f"--dataset={dataset}"
    )
    raise UserInputError(
        f"--log_root={log_root} holds a {saved['dataset']} run ("
        + ", ".join([saved["model"], *own[:1]])
        + f", says its {CONFIG_FILE}), not a run of {wanted}: to start one, "
        "give another --log_root (e.g. "
        f"--log_root={os.path.normpath(log_root)}_{dataset}); to continue "
        f"the {saved['dataset']} run, give its own "
        f"{' '.join(own) or 'flags'} {shlex.quote(f'--log_root={log_root}')}"
    )


def _unreadable(path, why):
    """The error of a saved config that cannot be read, with what to do.

    The checkpoints beside it are the run's state and stay usable: without
    the file, a run resumes from them with the flags it is given.
    """
    return UserInputError(
        f"{path}: {why}; the checkpoints beside it are untouched: move it "
        f"aside (mv {path} {path}.bad) and rerun with the flags the run was "
        "started with to resume from them"
    )


def _read_saved(log_root):
    """`(path, document)` of `log_root/config.json`; document None if none."""
    path = os.path.join(log_root, CONFIG_FILE)
    if not os.path.exists(path):
        return path, None
    try:
        with open(path, encoding="utf-8") as stream:
            return path, json.load(stream)
    except (OSError, ValueError) as error:
        raise _unreadable(path, f"unreadable ({error})") from None


# Fields that earlier versions saved and that no longer exist: a run saved
# with them resumes without them (`shuffle_buffer` gave way to a permutation
# of the whole split every epoch).
RETIRED_FIELDS = frozenset({"shuffle_buffer"})


def load_saved(log_root):
    """The flat fields of `log_root/config.json`, `None` if there is none.

    Each setting is read by its name, whichever group saved it, so a run
    saved before a setting moved to another group still resumes.
    """
    path, document = _read_saved(log_root)
    if document is None:
        return None
    try:
        saved = document["config"]
        values = {name: saved[name] for name in TOP_LEVEL if name in saved}
        for group in GROUPS:
            values.update(saved[group])
        current = {
            name: value
            for name, value in values.items()
            if name not in RETIRED_FIELDS
        }
        return flatten(make_config(**current))
    except (ValueError, KeyError, TypeError) as error:
        raise _unreadable(
            path, f"not a readable tf-resnet run configuration ({error})"
        ) from None


def read_plan(log_root):
    """The step plan a training run saved in `log_root`, `None` if none."""
    _, document = _read_saved(log_root)
    return None if document is None else document.get("plan")


def save(config, plan, write_fn):
    """Writes `config.json` (config and step plan) with `write_fn(path, fn)`.

    `write_fn` is `summaries.atomic_write`, passed in so this module stays
    free of TensorFlow.
    """
    document = {
        "config": json.loads(config.to_json()),
        "plan": dataclasses.asdict(plan),
    }
    path = os.path.join(config.run.log_root, CONFIG_FILE)
    write_fn(
        path,
        lambda stream: json.dump(document, stream, indent=2, sort_keys=True),
    )

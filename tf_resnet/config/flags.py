"""The absl flags of `resnet_main.py`, generated from the settings' schema.

One flag per `settings` field, of the same name, default, help and choices
(`schema.setting`), so a setting is defined once. The names and meanings
of the original tensorflow/models `resnet_main.py` and of the Ray ResNet
example are kept: `--dataset --mode --train_data_path --eval_data_path
--log_root --train_dir --eval_dir --eval_batch_count --eval_once
--num_gpus --image_size`.

Bounds are not handed to absl: `validation.validate` checks them, with the
same one-line error for the command line and for code building a config.

`--help` lists these flags grouped as the settings are: absl groups flags
by the module that declared them, so each flag is declared under its
group's section (`sections`), and `help_text` is absl's own rendering of
those sections. A usage error (an unknown flag, a bad choice or value) is
one line and exit code 2 (`parse`), as every other bad input; a flag that
other training scripts use (`--epochs`, `--lr`) is answered with ours.
"""

import sys

from absl import flags

from tf_resnet.config import layers, schema, settings

FLAGS = flags.FLAGS
USAGE_ERROR = 2  # resnet_main's exit code for bad input, flags included.
_HELP = frozenset(["--help", "-help", "-h", "-?", "--helpshort", "-helpshort"])
_HELP_FULL = frozenset(["--helpfull", "-helpfull"])
_NON_BREAKING_HYPHEN = "\u2011"
_TOP_SECTION = (
    "layers - named groups of the settings below (docs/recipes.md): a "
    "course task is one --preset; flags given win over them"
)
# Flags users of timm, Keras or PyTorch scripts type, and what to type here.
# Hints, not aliases: one name per setting keeps `config.json`, the presets
# and "a flag given wins" (`config.resolve`) keyed by one name, and some
# differ in meaning (`--learning_rate` is scaled with the batch, `--resume`
# takes no path: a run resumes by itself).
OTHER_NAMES = {
    "epochs": "--train_epochs (or --train_steps)",
    "num_epochs": "--train_epochs (or --train_steps)",
    "lr": (
        "--learning_rate (quoted at batch 128, scaled linearly with the "
        "global --batch_size)"
    ),
    "wd": "--weight_decay",
    "resume": (
        "no flag: a run resumes by itself from the newest checkpoint in "
        "its --log_root (give the same --log_root)"
    ),
    "data_dir": (
        "--train_data_path and --eval_data_path (globs of the files, or "
        "the tiny-imagenet-200 folder for both), or --tfds_data_dir with "
        "--data_source=tfds"
    ),
    "model_dir": "--log_root",
    "output_dir": "--log_root",
    "log_dir": "--log_root",
    "logdir": "--log_root",
    "checkpoint_dir": "--log_root",
    "arch": "--model",
    "gpus": "--num_gpus",
    "amp": "--dtype=mixed_float16 (GPUs) or --dtype=mixed_bfloat16 (CPUs)",
    "evaluate": "--mode=eval",
    "collective_timeout_secs": (
        "--peer_timeout_secs (the bound on waiting for peers, for every "
        "engine; multi_worker's collectives get it too)"
    ),
}


def sections():
    """`{group: its --help section}`: the group and its docstring's line."""
    titles = {}
    for group, cls in settings.GROUPS.items():
        summary = cls.__doc__.strip().splitlines()[0].rstrip(".")
        titles[group] = f"{group} settings - {summary[0].lower()}{summary[1:]}"
    return titles


def define(field, flag_values=FLAGS, section=None):
    """Defines the absl flag of one settings field, in its help section."""
    name, default = field.name, field.default
    help_text = field.metadata["help"]
    kind, allowed = schema.base_type(field), schema.choices(field)
    where = {"flag_values": flag_values, "module_name": section}
    if allowed:
        flags.DEFINE_enum(name, default, list(allowed), help_text, **where)
        # absl joins the choices with `|` alone, and its help wraps that
        # one long word mid-name (`course_t`/`inyimagenet`): spaced, it
        # wraps between choices.
        flag_values[name].help = f"<{' | '.join(allowed)}>: {help_text}"
    elif kind is bool:
        flags.DEFINE_bool(name, default, help_text, **where)
    elif kind is int:
        flags.DEFINE_integer(name, default, help_text, **where)
    elif kind is float:
        flags.DEFINE_float(name, default, help_text, **where)
    elif kind is tuple:
        flags.DEFINE_list(name, list(default), help_text, **where)
    else:
        flags.DEFINE_string(name, default, help_text, **where)


def define_all(flag_values=FLAGS):
    """Every flag of resnet_main.py: one per settings field, by group."""
    titles = sections()
    for field in settings.fields():
        group = settings.FIELD_GROUP.get(field.name)
        define(field, flag_values, titles[group] if group else _TOP_SECTION)


def help_text(flag_values=FLAGS):
    """The project's flags, section by section, as absl renders them.

    The layers first: `--preset` is the flag a student starts with.
    """
    titles = [_TOP_SECTION, *sections().values()]
    # absl's wrapping breaks lines at hyphens, which cuts a path such as
    # cifar-10-batches-bin in two: non-breaking ones while it wraps.
    flags_of = flag_values.flags_by_module_dict()
    ours = [flag for title in titles for flag in flags_of.get(title, [])]
    helps = {id(flag): flag.help for flag in ours}
    try:
        for flag in ours:
            flag.help = flag.help.replace("-", _NON_BREAKING_HYPHEN)
        text = "\n".join(flag_values.module_help(title) for title in titles)
    finally:
        for flag in ours:
            flag.help = helps[id(flag)]
    return text.replace(_NON_BREAKING_HYPHEN, "-")


def _message(error):
    """The parse error as one line; an unknown `--epochs` names our flag.

    absl suggests the flag nearest in spelling (`--data_dir`: did you mean
    `data_source`?), which for those names is the wrong one.
    """
    name = getattr(error, "flagname", None)
    if name is not None:
        hint = OTHER_NAMES.get(name.replace("-", "_"))
        if hint:
            return f"unknown flag --{name}; here: {hint}"
    return " ".join(str(error).split()) + " (--help lists the flags)"


def parse(argv, doc="", program="resnet_main", flag_values=FLAGS):
    """Parses `argv` with absl, as `app.run`'s `flags_parser`.

    `--help` (`-h`) prints `doc` and the project's flags by group and exits
    0; `--helpfull` adds absl's and TensorFlow's own. A usage error is one
    `PROGRAM: error:` line and exit 2, where absl's parser exits 1 after
    several lines: a batch script reads 2 as "bad flags or data".

    Returns:
      What `flag_values(argv)` returns: the program and no other argument.
    """
    given = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    if _HELP.intersection(given) or _HELP_FULL.intersection(given):
        print(doc.rstrip(), end="\n\n")
        print(f"usage: {argv[0]} [--flag=value ...]")
        print(help_text(flag_values))
        if _HELP_FULL.intersection(given):
            print(flag_values.get_help())
        else:
            print("\nabsl's and TensorFlow's own flags too: --helpfull")
        sys.exit(0)
    try:
        rest = flag_values(argv)
    except flags.Error as error:
        print(
            f"{program}: error: {_message(error)}",
            file=sys.stderr,
        )
        sys.exit(USAGE_ERROR)
    if len(rest) > 1:
        print(
            f"{program}: error: unexpected argument {rest[1]!r}: every "
            "setting is a flag, --name=value (--help lists them)",
            file=sys.stderr,
        )
        sys.exit(USAGE_ERROR)
    return rest


def config_from_flags(flag_values=FLAGS):
    """The run's `settings.Config` from the parsed flags, layered, validated.

    Flags given on the command line win over `--preset` and over the saved
    configuration of the run in `--log_root` (`config.resolve`).
    """
    return layers.resolve(*_given(flag_values))


def taken_from_saved(flag_values=FLAGS):
    """The settings `--log_root`'s `config.json` gave, not the flags."""
    return layers.taken_from_saved(*_given(flag_values))


def _given(flag_values):
    """`(every setting's flag value, the names given on the command line)`."""
    names = settings.FIELD_NAMES
    values = {name: flag_values[name].value for name in names}
    explicit = {name for name in names if flag_values[name].present}
    return values, explicit

"""The absl flags of `resnet_main.py`, generated from the settings' schema.

One flag per `settings` field, of the same name, default, help and choices
(`schema.setting`), so a setting is defined once. The names and meanings
of the original tensorflow/models `resnet_main.py` and of the Ray ResNet
example are kept: `--dataset --mode --train_data_path --eval_data_path
--log_root --train_dir --eval_dir --eval_batch_count --eval_once
--num_gpus --image_size`.

Bounds are not handed to absl: `validation.validate` checks them, with the
same one-line error for the command line and for code building a config.
"""

from absl import flags

from tf_resnet import config, schema, settings

FLAGS = flags.FLAGS


def define(field, flag_values=FLAGS):
    """Defines the absl flag of one settings field."""
    name, default = field.name, field.default
    help_text = field.metadata["help"]
    kind, allowed = schema.base_type(field), schema.choices(field)
    if allowed:
        flags.DEFINE_enum(
            name, default, list(allowed), help_text, flag_values=flag_values
        )
    elif kind is bool:
        flags.DEFINE_bool(name, default, help_text, flag_values=flag_values)
    elif kind is int:
        flags.DEFINE_integer(name, default, help_text, flag_values=flag_values)
    elif kind is float:
        flags.DEFINE_float(name, default, help_text, flag_values=flag_values)
    elif kind is tuple:
        flags.DEFINE_list(
            name, list(default), help_text, flag_values=flag_values
        )
    else:
        flags.DEFINE_string(name, default, help_text, flag_values=flag_values)


def define_all(flag_values=FLAGS):
    """Every flag of resnet_main.py: one per settings field."""
    for field in settings.fields():
        define(field, flag_values)


def config_from_flags(flag_values=FLAGS):
    """The run's `settings.Config` from the parsed flags, layered, validated.

    Flags given on the command line win over `--preset` and over the saved
    configuration of the run in `--log_root` (`config.resolve`).
    """
    names = settings.FIELD_NAMES
    values = {name: flag_values[name].value for name in names}
    explicit = {name for name in names if flag_values[name].present}
    return config.resolve(values, explicit)

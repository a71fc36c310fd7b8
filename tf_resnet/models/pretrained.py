"""ImageNet weights for fine-tuning, read from local files only.

Nothing is downloaded at run time (training machines are often offline and
a silent multi-megabyte fetch in the middle of a job is a surprise). Two
sources:

* `--pretrained=imagenet` with `--model=resnet50`: Keras' own ResNet50
  ImageNet weights, looked up in the Keras cache (`$KERAS_HOME/models/`,
  default `~/.keras/models/`) under the name Keras itself downloads them
  to; `--pretrained=/path/to/that.h5` names the file directly. The model is
  then Keras' ResNet50 architecture (v1: stride on the first 1x1 conv,
  biased convolutions) with a new classifier, because the weights only fit
  that architecture.
* `--pretrained=FILE.pth|.pt|.npz|.safetensors` with resnet18/34/50: a
  torchvision state dict, mapped tensor by tensor onto the torchvision-
  layout models of `imagenet_resnet` (Keras ships no ResNet-18/34).

Either way the classifier is the `Dense` layer named `logits`
(`resnet.HEAD_LAYER`) and everything else the backbone, the split that
`tf_resnet.param_groups` freezes and slows down when fine-tuning.
"""

import os
import re

import keras
import numpy as np
from absl import logging
from keras import layers

from tf_resnet.config import families
from tf_resnet.errors import UserInputError
from tf_resnet.models.resnet import HEAD_LAYER

# torchvision's layout is the ImageNet family's (`imagenet_resnet`).
TORCHVISION_MODELS = families.models_of(families.IMAGENET)
KERAS_RESNET50_FILE = "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"
# Keras' ResNet50 weights expect BGR pixels minus the ImageNet mean
# ("caffe" preprocessing), whose spread is about 57 grey levels; the input
# pipeline yields per-image standardised RGB. Scaling by that spread and
# swapping the channels gives inputs of the right order and magnitude.
CAFFE_PIXEL_STD = 57.4

# Keras variable path -> torchvision state-dict name, applied in order.
_TORCH_NAMES = (
    (r"^stem_conv/", "conv1/"),
    (r"^stem_bn/", "bn1/"),
    (r"^logits/", "fc/"),
    (r"^stage(\d+)/block(\d+)/", r"layer\1/\2/"),
    (r"/shortcut/conv/", "/downsample/0/"),
    (r"/shortcut/bn/", "/downsample/1/"),
    (r"/(kernel|gamma)$", "/weight"),
    (r"/beta$", "/bias"),
    (r"/moving_mean$", "/running_mean"),
    (r"/moving_variance$", "/running_var"),
)


def build(name, source, build_fn, num_classes, input_shape, options):
    """Builds model `name` initialised from `source` (see module docstring).

    Args:
      name: registered model name.
      source: `"imagenet"`, a Keras `.h5` weights file or a torchvision
        state-dict file.
      build_fn: builds the registered model (randomly initialised).
      num_classes: classes of the new classifier.
      input_shape: `(H, W, 3)`.
      options: the model options (only `stem="imagenet"` fits Keras'
        ResNet50).

    Returns:
      A `keras.Model` returning logits.

    Raises:
      UserInputError: the file is absent, unreadable or does not fit.
    """
    if source == "imagenet" or source.endswith(".h5"):
        if name != "resnet50":
            raise UserInputError(
                f"--pretrained={source}: Keras ships ImageNet weights for "
                f"resnet50 only, not {name}; for "
                f"{families.IMAGENET_LABEL} "
                "pass a torchvision state dict (.pth, .npz or .safetensors), "
                "e.g. --pretrained=resnet18-f37072fd.pth"
            )
        return keras_resnet50(
            num_classes, input_shape, keras_weights_path(source), options
        )
    if name not in TORCHVISION_MODELS:
        raise UserInputError(
            f"--pretrained={source}: torchvision weights fit only "
            f"{', '.join(TORCHVISION_MODELS)}, not --model={name}"
        )
    model = build_fn()
    skipped = load_torchvision_weights(model, source)
    logging.info(
        "loaded %s into %s%s",
        source,
        model.name,
        f" (new classifier, skipped {', '.join(skipped)})" if skipped else "",
    )
    return model


def check_source(source):
    """Fails as `build` would on a missing weights file, before it is built.

    So a run finds it out before it writes anything in its `--log_root`.
    """
    if source == "imagenet" or source.endswith(".h5"):
        keras_weights_path(source)
    elif source:
        _existing(source)


def keras_weights_path(source):
    """The local Keras ResNet50 weights file; never downloads it."""
    if source != "imagenet":
        return _existing(source)
    home = os.environ.get("KERAS_HOME") or os.path.join("~", ".keras")
    path = os.path.join(os.path.expanduser(home), "models", KERAS_RESNET50_FILE)
    if not os.path.isfile(path):
        raise UserInputError(
            families.missing_weights(path, "--pretrained=imagenet")
            + " (or pass --pretrained=/path/to/it); tf-resnet never "
            "downloads"
        )
    return path


def _existing(path):
    """`path`, or the error that says where its file comes from."""
    if not os.path.isfile(path):
        raise UserInputError(families.missing_weights(path))
    return path


def keras_resnet50(num_classes, input_shape, weights_path, options):
    """Keras' ResNet50 with ImageNet weights and a new `logits` layer."""
    # Options at the values that describe Keras' own ResNet50 are fine.
    fitting = {"stem": "imagenet", "zero_init_residual": False}
    unsupported = sorted(
        key
        for key, value in options.items()
        if key not in fitting or value != fitting[key]
    )
    if unsupported:
        raise UserInputError(
            "--pretrained=imagenet builds Keras' own ResNet50, which has no "
            f"option {', '.join(unsupported)}"
        )
    inputs = keras.Input(shape=input_shape, name="images")
    x = layers.Rescaling(CAFFE_PIXEL_STD, name="caffe_scale")(inputs)
    x = keras.ops.flip(x, axis=-1)  # RGB -> BGR.
    try:
        backbone = keras.applications.ResNet50(
            include_top=False,
            weights=weights_path,
            input_shape=input_shape,
            pooling="avg",
            name="backbone",
        )
    except (OSError, ValueError) as error:
        raise UserInputError(
            f"{weights_path}: not Keras' ResNet50 no-top weights ({error})"
        ) from error
    outputs = layers.Dense(num_classes, name=HEAD_LAYER)(backbone(x))
    return keras.Model(inputs, outputs, name="keras_resnet50")


def torch_name(variable_path):
    """The torchvision state-dict name of a Keras variable path."""
    for pattern, replacement in _TORCH_NAMES:
        variable_path = re.sub(pattern, replacement, variable_path)
    return variable_path.replace("/", ".")


def read_state_dict(path):
    """`{name: numpy array}` from a .pth/.pt, .npz or .safetensors file."""
    _existing(path)
    extension = os.path.splitext(path)[1].lower()
    if extension in (".pth", ".pt"):
        return _read_torch(path)
    if extension == ".npz":
        try:
            with np.load(path) as archive:
                return {name: archive[name] for name in archive.files}
        except (OSError, ValueError) as error:
            raise UserInputError(
                f"{path}: not a .npz archive ({error})"
            ) from None
    if extension == ".safetensors":
        return _read_safetensors(path)
    raise UserInputError(
        f"{path}: --pretrained must be 'imagenet', a Keras .h5 weights file "
        "or a torchvision state dict (.pth, .pt, .npz, .safetensors)"
    )


def _read_torch(path):
    try:
        import torch  # Optional: only .pth/.pt files need it.
    except ImportError:
        raise UserInputError(
            f"{path}: reading .pth files needs PyTorch, which is not "
            "installed; export the state dict as .npz where torch is: "
            "numpy.savez('w.npz', **{k: v.numpy() for k, v in "
            "torch.load('w.pth').items()})"
        ) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for bad files.
        raise UserInputError(f"{path}: not a PyTorch file ({error})") from None
    if not isinstance(state, dict):
        raise UserInputError(
            f"{path}: holds a {type(state).__name__}, not a state dict "
            "(save model.state_dict())"
        )
    return {name: value.detach().cpu().numpy() for name, value in state.items()}


def _read_safetensors(path):
    import safetensors.numpy  # Only .safetensors files need it.

    try:
        return safetensors.numpy.load_file(path)
    except Exception as error:  # A Rust-side SafetensorError, or OSError.
        raise UserInputError(
            f"{path}: not a safetensors file ({error})"
        ) from None


def _to_keras_layout(value):
    """Conv OIHW -> HWIO, dense (out, in) -> (in, out), vectors as they are."""
    if value.ndim == 4:
        return value.transpose(2, 3, 1, 0)
    if value.ndim == 2:
        return value.T
    return value


def _torch_shape(keras_shape):
    """Inverse of `_to_keras_layout` on shapes, for error messages."""
    shape = tuple(keras_shape)
    if len(shape) == 4:
        return (shape[3], shape[2], shape[0], shape[1])
    return shape[::-1]


def _name_list(names, limit=8):
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def load_torchvision_weights(model, path):
    """Assigns every variable of `model` from a torchvision state dict.

    Every tensor must map by name and shape (`num_batches_tracked` is
    ignored). When the file's classifier has another class count, `fc.*` is
    skipped and the model keeps its freshly initialised `logits`. Nothing
    is assigned unless everything fits.

    Args:
      model: a model of `imagenet_resnet` (variable names as built there).
      path: `.pth`/`.pt` (needs torch), `.npz` or `.safetensors` file.

    Returns:
      The names of the file's tensors that were skipped (the classifier).

    Raises:
      UserInputError: naming every missing, unmapped or mis-shaped tensor.
    """
    state = {
        name: value
        for name, value in read_state_dict(path).items()
        if not name.endswith("num_batches_tracked")
    }
    variables = {torch_name(v.path): v for v in model.weights}
    skipped = []
    file_head = state.get("fc.weight")
    if file_head is not None and file_head.shape[0] != model.output_shape[-1]:
        skipped = sorted(name for name in state if name.startswith("fc."))
        state = {k: v for k, v in state.items() if k not in skipped}
        variables = {k: v for k, v in variables.items() if k not in skipped}
    missing = sorted(set(variables) - set(state))
    unmapped = sorted(set(state) - set(variables))
    problems = []
    if missing:
        problems.append(f"missing tensors {_name_list(missing)}")
    if unmapped:
        problems.append(f"unmapped tensors {_name_list(unmapped)}")
    for name in sorted(set(variables) & set(state)):
        needed = tuple(variables[name].shape)
        if _to_keras_layout(state[name]).shape != needed:
            problems.append(
                f"{name} has shape {tuple(state[name].shape)}, "
                f"{model.name} needs {_torch_shape(needed)}"
            )
    if problems:
        raise UserInputError(
            f"{path}: does not fit --model={model.name}: {'; '.join(problems)}"
        )
    for name, variable in variables.items():
        variable.assign(_to_keras_layout(state[name]).astype(variable.dtype))
    return skipped

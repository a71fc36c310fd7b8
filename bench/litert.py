r"""LiteRT int8 and float against the SavedModel: accuracy, size, latency.

  .venv/bin/python bench/litert.py --run=resnet20:runs/resnet20 \\
      --run=course_resnet:runs/course --out=/tmp/litert-bench

For each trained run (`NAME:LOG_ROOT`), `resnet_main.py --mode=export`
with `--litert=float` and `--litert=int8` into `OUT/NAME-float` and
`OUT/NAME-int8`; the export evaluates each `.tflite` beside the SavedModel
on the run's evaluation split (`export.json`), which gives top-1, top-5 and
the top-1 agreement. Then the per-image latency at batch 1 on the first
`--latency_images` evaluation images: the SavedModel's serving signature
(TensorFlow's thread pools as they start) and each `.tflite` through the
interpreter `tf_resnet.predict` uses (its default threads, XNNPACK),
timed in alternating rounds so that a change of the machine's load hits
all three alike.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

KINDS = ("float", "int8")


def export(log_root, export_dir, kind, extra):
    """`resnet_main.py --mode=export --litert=kind`; its export.json."""
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(common.ROOT, "resnet_main.py"),
            "--mode=export",
            f"--log_root={log_root}",
            f"--export_dir={export_dir}",
            f"--litert={kind}",
            *extra,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    if proc.returncode:
        raise SystemExit(f"export of {log_root} failed:\n{proc.stderr[-3000:]}")
    print(proc.stdout.strip())
    with open(os.path.join(export_dir, "export.json")) as f:
        return json.load(f)


def latencies(export_dirs, images, rounds):
    """Milliseconds per image at batch 1: `{contender: [per-round medians]}`."""
    import numpy as np
    import tensorflow as tf

    from tf_resnet.predict import litert_interpreter

    interpreter_class, _ = litert_interpreter()
    contenders = {}
    serve = tf.saved_model.load(export_dirs["float"]).signatures[
        "serving_default"
    ]
    contenders["SavedModel"] = lambda image: serve(images=tf.constant(image))
    for kind, folder in export_dirs.items():
        runner = interpreter_class(
            model_path=os.path.join(folder, "model.tflite")
        ).get_signature_runner("serving_default")
        contenders[f"LiteRT {kind}"] = lambda image, runner=runner: runner(
            images=image
        )
    times = {name: [] for name in contenders}
    for call in contenders.values():  # Warm-up: tracing, allocation.
        for image in images[:5]:
            call(image[None])
    for _ in range(rounds):
        for name, call in contenders.items():
            per_image = []
            for image in images:
                start = time.perf_counter()
                call(image[None])
                per_image.append(1000 * (time.perf_counter() - start))
            times[name].append(float(np.median(per_image)))
    return times


def bench_run(name, log_root, out, args):
    """Exports one run both ways; its table rows."""
    from tf_resnet import litert
    from tf_resnet.config import layers as config_lib
    from tf_resnet.config import settings

    extra = []
    if args.eval_data_path:
        extra.append(f"--eval_data_path={args.eval_data_path}")
    facts = {}
    dirs = {}
    for kind in KINDS:
        dirs[kind] = os.path.join(out, f"{name}-{kind}")
        facts[kind] = export(log_root, dirs[kind], kind, extra)["litert"]
    config = settings.make_config(**config_lib.load_saved(log_root))
    images, _, _ = litert.read_split(config, False, args.latency_images)
    times = latencies(dirs, images, args.rounds)
    variables = os.path.join(dirs["float"], "variables")
    saved_model_bytes = os.path.getsize(
        os.path.join(dirs["float"], "saved_model.pb")
    ) + sum(
        os.path.getsize(os.path.join(variables, f))
        for f in os.listdir(variables)
    )
    float_bytes = facts["float"]["bytes"]
    evaluation = facts["float"]["evaluation"]
    rows = [
        [
            name,
            "SavedModel",
            f"{100 * evaluation['saved_model']['top1']:.1f}",
            f"{100 * evaluation['saved_model']['top5']:.1f}",
            "",
            f"{saved_model_bytes / 1e6:.2f}",
            "",
            common.Stats(times["SavedModel"]).format(2),
        ]
    ]
    for kind in KINDS:
        evaluation = facts[kind]["evaluation"]
        rows.append(
            [
                name,
                f"LiteRT {kind}",
                f"{100 * evaluation['litert']['top1']:.1f}",
                f"{100 * evaluation['litert']['top5']:.1f}",
                f"{100 * evaluation['top1_agreement']:.1f}",
                f"{facts[kind]['bytes'] / 1e6:.2f}",
                f"{100 * facts[kind]['bytes'] / float_bytes:.0f}%",
                common.Stats(times[f"LiteRT {kind}"]).format(2),
            ]
        )
    print(
        f"   {name}: {evaluation['images']} evaluation images of "
        f"{evaluation['path']}; int8 calibrated on "
        f"{facts['int8']['calibration']['images']} images of "
        f"{facts['int8']['calibration']['path']}"
    )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--run",
        action="append",
        required=True,
        help="NAME:LOG_ROOT of a trained run (repeatable)",
    )
    parser.add_argument("--out", required=True, help="folder of the exports")
    parser.add_argument(
        "--eval_data_path", help="evaluation data (default: the run's)"
    )
    parser.add_argument("--latency_images", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    common.print_environment("LiteRT against the SavedModel")
    rows = []
    for spec in args.run:
        name, log_root = spec.split(":", 1)
        rows += bench_run(name, log_root, args.out, args)
    common.print_table(
        f"accuracy on each run's evaluation split, size, batch-1 latency "
        f"({args.latency_images} images, {args.rounds} rounds: median "
        f"(min-max) of the rounds' medians); load "
        f"{common.load_average():.2f} at end",
        [
            "model",
            "format",
            "top-1 %",
            "top-5 %",
            "top-1 agreement %",
            "MB",
            "of float .tflite",
            "ms/image",
        ],
        rows,
    )


if __name__ == "__main__":
    main()

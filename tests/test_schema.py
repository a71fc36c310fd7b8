"""One schema: every flag is generated from its config field; one registry."""

import importlib
import importlib.util

import pytest
from absl import flags

from tests.helpers import run_python
from tf_resnet import data, detect, runtime
from tf_resnet.config import engines, schema, settings, validation
from tf_resnet.config import flags as resnet_flags
from tf_resnet.engines import registry, startup
from tf_resnet.errors import UserInputError

# The flags of the original tensorflow/models resnet_main.py and of the Ray
# example, which must keep their names.
ORIGINAL_FLAGS = (
    "dataset", "mode", "train_data_path", "eval_data_path", "log_root",
    "train_dir", "eval_dir", "eval_batch_count", "eval_once", "num_gpus",
    "image_size",
)  # fmt: skip


@pytest.fixture(scope="module")
def flag_values():
    values = flags.FlagValues()
    resnet_flags.define_all(values)
    return values


def test_each_field_is_one_flag_with_its_default_help_and_choices(
    flag_values,
):
    fields = settings.fields()
    assert sorted(flag_values) == sorted(f.name for f in fields)
    assert set(ORIGINAL_FLAGS) <= set(flag_values)
    for field in fields:
        flag = flag_values[field.name]
        default = flag.default
        if isinstance(field.default, tuple):
            default = tuple(default)
        assert default == field.default, field.name
        assert flag.help.endswith(field.metadata["help"]), field.name
        allowed = schema.choices(field)
        assert getattr(flag.parser, "enum_values", None) == (
            list(allowed) if allowed else None
        ), field.name


def test_parsed_flags_fill_the_config(flag_values, tmp_path):
    flag_values(
        [
            "resnet_main.py",
            "--train_data_path=a",
            "--eval_data_path=b",
            f"--log_root={tmp_path}",
            "--lr_decay_fractions=0.3,0.6",
            "--noshuffle",
            "--worker_hosts=h:1,h:2",
            "--distribution=multi_worker",
        ]
    )
    try:
        config = resnet_flags.config_from_flags(flag_values)
    finally:
        flag_values.unparse_flags()
    assert config.optim.lr_decay_fractions == (0.3, 0.6)
    assert config.data.shuffle is False
    assert config.distribution.worker_hosts == ("h:1", "h:2")
    assert config.run.eval_dir == str(tmp_path / "eval")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"label_smoothing": 1.0}, "--label_smoothing must be in [0, 1), got"),
        ({"warmup_fraction": 1.5}, "--warmup_fraction must be in [0, 1], got"),
        ({"cutout_size": -1}, "--cutout_size must be non-negative, got -1"),
        ({"average_every": 0}, "--average_every must be at least 1, got 0"),
        ({"lr_schedule": "linear"}, "unknown --lr_schedule=linear; known:"),
        ({"distribution": "ray"}, "unknown --distribution=ray; known: auto"),
        ({"momentum": float("nan")}, "--momentum=nan: must be a finite"),
    ],
)
def test_bounds_and_choices_come_from_the_schema(values, message):
    config = settings.make_config(
        train_data_path="x", eval_data_path="y", **values
    )
    with pytest.raises(UserInputError) as error:
        validation.validate(config)
    assert message in str(error.value)


def test_the_eval_job_has_its_own_default_dir(tmp_path):
    train = settings.make_config(log_root=str(tmp_path))
    job = settings.make_config(log_root=str(tmp_path), mode="eval")
    assert train.run.eval_dir == str(tmp_path / "eval")
    assert job.run.eval_dir == str(tmp_path / "eval_job")


def test_the_registry_names_every_distribution_and_its_factories():
    field = {f.name: f for f in settings.fields()}["distribution"]
    assert schema.choices(field) == engines.distributions()
    assert ("auto", *registry.ENGINES) == engines.distributions()
    for engine in registry.ENGINES.values():
        factories = [engine.make, engine.serve, engine.averaging]
        calls = [(f.module, f.function) for f in factories if f is not None]
        assert calls or engine.rides_on  # Made by its carrier.
        for module, function in calls:
            if not registry.installed(engine):
                assert importlib.util.find_spec(module) is not None
                continue
            assert callable(getattr(importlib.import_module(module), function))
        if engine.launcher:
            launcher = f"tf_resnet.launch.{engine.launcher}"
            assert importlib.util.find_spec(launcher) is not None
    assert all(e.averaging for e in registry.AVERAGING_CARRIERS)


def _no_launcher(monkeypatch):
    for name in (
        "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "TF_CONFIG",
        "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "PMIX_RANK",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_auto_recognises_a_slurm_job_step_of_several_tasks(monkeypatch):
    _no_launcher(monkeypatch)
    dist = settings.DistributionConfig()
    assert startup.resolve("auto") == ("auto", "one process")
    assert registry.averaging_carrier(dist)[0].name == "horovod"
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # A batch script's shell.
    assert startup.resolve("auto")[0] == "auto"
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    reason = "a Slurm job step of 4 tasks (srun)"
    assert startup.resolve("auto") == ("multi_worker", reason)
    assert registry.averaging_carrier(dist) == (registry.MULTI_WORKER, reason)
    monkeypatch.setenv("HOROVOD_SIZE", "4")  # horovodrun's ranks win.
    assert startup.resolve("auto")[0] == "horovod"


def test_auto_takes_the_tasks_of_an_mpi_job_step_for_horovod_ranks(
    monkeypatch,
):
    """`srun --mpi=pmix` sets PMIX_RANK and no size: the step's tasks are
    the ranks; `srun --mpi=pmi2` sets PMI_SIZE; `--mpi=none` neither."""
    _no_launcher(monkeypatch)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    assert startup.resolve("auto")[0] == "multi_worker"
    monkeypatch.setenv("PMIX_RANK", "1")
    assert startup.resolve("auto") == (
        "horovod",
        "started as one of 2 ranks (PMIX_RANK, srun --mpi=pmix)",
    )
    assert startup.processes_in_sync(registry.get("horovod")) == 2
    with pytest.raises(UserInputError, match="srun --mpi=none"):
        startup.resolve("multi_worker")
    monkeypatch.delenv("PMIX_RANK")
    monkeypatch.setenv("PMI_SIZE", "2")
    assert startup.resolve("auto")[0] == "horovod"


def test_an_engine_of_several_processes_started_alone_says_so(monkeypatch):
    """A synchronous engine no launcher started trains alone, with a word
    of it and the launcher's command; an asynchronous one is refused."""
    _no_launcher(monkeypatch)
    argv = ["resnet_main.py", "--preset=course_sync_cifar100", "--log_root=r"]
    dist = settings.DistributionConfig()
    python = detect.interpreter()
    assert not python.startswith("python")  # The venv's, as the docs type.
    warning = startup.alone(
        registry.get("horovod"), "--preset=course_sync_cifar100", dist, argv
    )
    assert warning.startswith("one process: --distribution=horovod (--preset")
    assert (
        f"for 2 processes on this machine: {python} -m tf_resnet.launch."
        "horovod --np=2 -- --preset=course_sync_cifar100 --log_root=r;"
    ) in warning
    argv[1] = "--preset=course_async_cifar100"
    with pytest.raises(UserInputError) as refused:
        startup.alone(registry.get("parameter_server"), "x", dist, argv)
    assert (
        f"{python} -m tf_resnet.launch.ps --num_ps=1 --num_workers=2 -- "
        "--preset=course_async_cifar100 --log_root=r;"
    ) in str(refused.value)
    with pytest.raises(UserInputError) as refused:
        startup.alone(
            registry.get("multi_worker"), "--distribution", dist, argv
        )
    assert str(refused.value).startswith(
        "--distribution=multi_worker runs as processes that a launcher starts"
    )
    assert f"{python} -m tf_resnet.launch.tf_config_cluster --np=2 -- " in (
        str(refused.value)
    )
    # Started by a launcher, in a cluster, or an engine of one process.
    for engine in ("default", "mirrored"):
        assert startup.alone(registry.get(engine), "x", dist, argv) is None
    two_workers = settings.DistributionConfig(worker_hosts=("a:1", "b:2"))
    assert not startup.alone(registry.get("multi_worker"), "", two_workers)
    monkeypatch.setenv("HOROVOD_SIZE", "1")  # horovodrun -np 1: asked for.
    assert startup.alone(registry.get("horovod"), "x", dist, argv) is None


def test_per_process_engines_refuse_sync_bn_and_several_devices():
    per_process = [n for n, e in registry.ENGINES.items() if e.per_process]
    assert per_process == ["horovod", "averaging"]
    for name in registry.ENGINES:
        config = settings.make_config(
            distribution=name,
            sync_bn=True,
            train_data_path="x",
            eval_data_path="y",
        )
        if name in per_process:
            with pytest.raises(UserInputError, match="--sync_bn is not"):
                validation.validate(config)
            two = settings.DistributionConfig(name, cpu_replicas=2)
            with pytest.raises(UserInputError, match="one .* per .*"):
                registry.ENGINES[name].check(two)
        elif name != "parameter_server":  # Which needs a cluster.
            validation.validate(config)


def test_all_reduce_knobs_are_refused_by_engines_that_do_not_take_them():
    takers = {
        "gradient_compression": (
            "fp16",
            ["mirrored", "horovod", "multi_worker"],
        ),
        "all_reduce_pack_bytes": (4096, ["horovod", "multi_worker"]),
    }
    for flag, (value, engine_names) in takers.items():
        for name, engine in registry.ENGINES.items():
            dist = settings.DistributionConfig(name, **{flag: value})
            if name in engine_names:
                engines.check_settings(engine, dist)
                continue
            with pytest.raises(UserInputError) as error:
                engines.check_settings(engine, dist)
            assert str(error.value) == (
                f"--{flag}={value} is for a gradient all-reduce; "
                f"--distribution={name} has none that takes it (engines "
                f"that do: {', '.join(engine_names)})"
            )
    # `auto` on one device is `default`, refused when its mode is made.
    one_device = settings.DistributionConfig(gradient_compression="fp16")
    with pytest.raises(UserInputError, match="--distribution=default has"):
        runtime.distributor_for("auto", 16, one_device)


def test_synchronised_bn_is_refused_with_micro_batches():
    config = settings.make_config(
        sync_bn=True,
        accumulate_steps=2,
        train_data_path="x",
        eval_data_path="y",
    )
    with pytest.raises(UserInputError, match="--sync_bn does not work with"):
        validation.validate(config)


def test_every_input_knob_is_a_data_setting_the_pipeline_is_given():
    knobs = {"normalization": "dataset", "cutout_size": 4, "mixup_alpha": 0.2}
    options = data.input_options(settings.make_config(**knobs), seed=3)
    for name, value in {**knobs, "seed": 3}.items():
        assert getattr(options, name) == value, name


def test_the_config_package_loads_without_tensorflow():
    code = (
        "import sys, pkgutil, importlib, tf_resnet.config as package\n"
        "for module in pkgutil.iter_modules(package.__path__):\n"
        "    importlib.import_module(f'tf_resnet.config.{module.name}')\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in "
        "('tensorflow', 'keras')))\n"
    )
    assert run_python(code).strip() == "[]"

"""An engine's facts live in its `Engine` record: nothing else tests names.

Read as source, without running it: every condition, loop, dictionary key
or subscript of the package, `resnet_main.py` and the benchmarks that
names an engine, outside the engine wing (`tf_resnet/engines/`) and the
engine's own modules, is a fact of the engine kept somewhere else; every
read of a launcher's environment variable outside `detect.py` is a second
place that knows how processes are started.
"""

import ast
import pathlib

from tests.helpers import ROOT
from tf_resnet.engines import registry

PACKAGE = pathlib.Path(ROOT) / "tf_resnet"
BENCH = pathlib.Path(ROOT) / "bench"
# The engine wing: where every engine's facts are.
WING = "engines/"
# Besides the wing, the modules an engine's name may be named in: its
# distributor's and its launcher's.
OWN_MODULES = {
    "default": {"distribute/tf_strategy.py"},
    "mirrored": {"distribute/tf_strategy.py"},
    "horovod": {
        "distribute/horovod_ranks.py",
        "launch/horovod.py",
        "jobs/cli.py",  # Its Horovod step's command lines.
    },
    "averaging": {"distribute/averaging.py"},
    "parameter_server": {"distribute/parameter_server.py", "launch/ps.py"},
    "multi_worker": {
        "distribute/multi_worker.py",
        "launch/tf_config_cluster.py",
    },
}
# What launchers and schedulers set for the processes they start.
LAUNCH_VARIABLES = (
    "HOROVOD_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "PBS_", "TF_CONFIG",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES",
)  # fmt: skip


def _sources():
    """`(relative path, tree)`: the package's relative to it, the others'
    to the repository (`resnet_main.py`, `bench/...`)."""
    files = [
        *sorted(PACKAGE.rglob("*.py")),
        pathlib.Path(ROOT, "resnet_main.py"),
        *sorted(BENCH.rglob("*.py")),
    ]
    for path in files:
        relative = (
            path.relative_to(PACKAGE).as_posix()
            if (PACKAGE in path.parents)
            else path.relative_to(ROOT).as_posix()
        )
        yield relative, ast.parse(path.read_text(encoding="utf-8"))


def _strings(node):
    """The string constants of a comparison operand (tuples included)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for element in node.elts for s in _strings(element)]
    return []


def engine_names_in_conditions(relative, tree):
    """`[(line, name)]` of engine names tested, looped over or used as keys.

    A name compared with or matched; a name in the tuple a loop or a
    comprehension runs over; a dictionary's key; a subscript's. A name as
    a value (the `--distribution` of a job the bench runs) is not a fact.
    """
    found = []
    for node in ast.walk(tree):
        operands = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        elif isinstance(node, ast.For | ast.comprehension):
            operands = [node.iter]
        elif isinstance(node, ast.Dict):
            operands = [key for key in node.keys if key is not None]
        elif isinstance(node, ast.Subscript):
            operands = [node.slice]
        for operand in operands:
            for name in _strings(operand):
                if (
                    name in registry.ENGINES
                    and not relative.startswith(WING)
                    and relative not in OWN_MODULES.get(name, ())
                ):
                    found.append((operand.lineno, name))
    return sorted(found, key=lambda found: found[0])


def launch_variables_read(tree):
    """`[(line, variable)]` of launcher variables read from the environment."""
    found = []

    def is_environ(node):
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "environ"
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        )

    for node in ast.walk(tree):
        keys = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if (is_environ(node.func.value) and node.func.attr == "get") or (
                node.func.attr == "getenv"
            ):
                keys = node.args[:1]
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            keys = [node.slice] if isinstance(node.ctx, ast.Load) else []
        elif isinstance(node, ast.Compare) and any(
            is_environ(c) for c in node.comparators
        ):
            keys = [node.left]
        for key in keys:
            for name in _strings(key):
                if name.startswith(LAUNCH_VARIABLES):
                    found.append((node.lineno, name))
    return found


def test_every_engine_has_its_own_modules_listed():
    assert set(OWN_MODULES) == set(registry.ENGINES)
    for modules in OWN_MODULES.values():
        assert all((PACKAGE / module).is_file() for module in modules)


def test_no_condition_outside_the_wing_names_an_engine():
    found = [
        f"{relative}:{line}: {name}"
        for relative, tree in _sources()
        for line, name in engine_names_in_conditions(relative, tree)
    ]
    assert not found, "engine facts outside the wing:\n" + "\n".join(found)


def test_the_check_sees_a_name_in_a_condition():
    tree = ast.parse('if x in ("multi_worker", "averaging"):\n    pass\n')
    assert engine_names_in_conditions("devices.py", tree) == [
        (1, "multi_worker"),
        (1, "averaging"),
    ]
    assert engine_names_in_conditions("launch/tf_config_cluster.py", tree) == [
        (1, "averaging")
    ]
    assert engine_names_in_conditions("engines/startup.py", tree) == []


def test_the_check_sees_a_loop_a_key_and_a_subscript_naming_an_engine():
    tree = ast.parse(
        'for e in ("horovod", "x"):\n    pass\n'
        '[e for e in ["mirrored"]]\n'
        'launcher = {"multi_worker": "tf_config_cluster"}\n'
        'ENGINES["averaging"]\n'
        'job({"distribution": "horovod"})\n'
    )
    assert engine_names_in_conditions("bench/scaling.py", tree) == [
        (1, "horovod"),
        (3, "mirrored"),
        (4, "multi_worker"),
        (5, "averaging"),
    ]


def test_only_detect_reads_the_environment_of_a_launch():
    found = [
        f"{relative}:{line}: {name}"
        for relative, tree in _sources()
        if relative != "detect.py"
        for line, name in launch_variables_read(tree)
    ]
    assert not found, "launch variables read outside detect.py:\n" + "\n".join(
        found
    )


def test_the_check_sees_a_read_of_a_launch_variable():
    tree = ast.parse(
        'a = os.environ.get("SLURM_PROCID")\nb = "TF_CONFIG" in os.environ\n'
        'os.environ["HOROVOD_CYCLE_TIME"] = "5"\nc = os.environ["PMI_SIZE"]\n'
    )
    assert launch_variables_read(tree) == [
        (1, "SLURM_PROCID"),
        (2, "TF_CONFIG"),
        (4, "PMI_SIZE"),
    ]

"""An engine is one entry: a made-up one, from one module, runs everywhere.

`tests/dummy_engine.py` registers `dummy`; each command below imports it
first (as a new engine's module would be imported) and then runs as the
user would: `resnet_main.py --dry_run`, `python -m tf_resnet.scaling`, the
bench's list of rows. Nothing else names the engine. Each runs in a
process of its own, so the registry of this one stays the project's.
"""

import json

from tests.helpers import run_main, run_python

# The command `argv` run as `python <script>` or `python -m <module>`,
# after `tests.dummy_engine` registered its engine.
AS_THE_COMMAND = """
import runpy, sys
import tests.dummy_engine
kind, target, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = target
try:
    if kind == "-m":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
"""
DRY_RUN = ["--dry_run", "--train_data_path=x", "--eval_data_path=y"]


def test_dry_run_plans_the_registered_engine_and_no_other_knows_it(tmp_path):
    flags = [*DRY_RUN, f"--log_root={tmp_path}/run", "--distribution=dummy"]
    output = run_python(AS_THE_COMMAND, "script", "resnet_main.py", *flags)
    assert "engine: dummy (--distribution)" in output, output
    assert not (tmp_path / "run").exists()  # Nothing written.
    unknown = run_main(flags)  # Without its module, no such engine.
    assert unknown.returncode != 0
    assert "--distribution" in unknown.stderr


def test_the_scaling_model_projects_it():
    output = run_python(
        AS_THE_COMMAND, "-m", "tf_resnet.scaling", "--model=resnet20",
        "--gpus=16", "--gpus_per_node=8",
    )  # fmt: skip
    rows = [line.split()[0] for line in output.splitlines() if line.strip()]
    assert "dummy" in rows, output
    assert "horovod" in rows, output


ROWS = """
import json, sys
import tests.dummy_engine
sys.path.insert(0, "bench")
import network_jobs
print(json.dumps([[r.name, r.flags] for r in network_jobs.rows(4, 2**20)]))
"""


def test_the_bench_gives_it_a_row():
    rows = json.loads(run_python(ROWS).splitlines()[-1])
    assert ["dummy", {"distribution": "dummy"}] in rows, rows

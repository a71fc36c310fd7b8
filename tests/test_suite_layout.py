"""The test suite's own layout: a test module imports no other one, and
the benchmarks use nothing of the tests.

What two test modules share lives in `tests/helpers.py` or in a helper
module named for what it holds (`data_files`, `engine_runs`,
`slurm_cluster`), so a test module can be read, run and changed alone.
"""

import ast
import glob
import os

from tests.helpers import ROOT


def _parsed(path):
    with open(path) as stream:
        return ast.parse(stream.read(), filename=path)


def _imported_modules(path):
    """Every module the file at `path` imports, anywhere in it, dotted."""
    found = set()
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # `from .test_x import y`, `from . import test_x`
                base = "tests" + (f".{node.module}" if node.module else "")
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(names)
    return found


def _imported_test_modules(path):
    """The `tests.test_*` modules the file at `path` imports, anywhere in it."""
    found = set()
    for name in _imported_modules(path):
        parts = name.split(".")
        if parts[0] == "tests" and parts[1:2] and parts[1][:5] == "test_":
            found.add(".".join(parts[:2]))
    return found


def _offenders(pattern, at_least, find):
    """`{path: sorted(find(path))}` of the files matching that find some.

    `at_least`: how many files the pattern must match (it found them).
    """
    paths = sorted(glob.glob(os.path.join(ROOT, pattern)))
    assert len(paths) > at_least, paths
    found = {os.path.relpath(path, ROOT): sorted(find(path)) for path in paths}
    return {path: names for path, names in found.items() if names}


def test_no_test_module_imports_another_test_module():
    offenders = _offenders("tests/test_*.py", 40, _imported_test_modules)
    assert not offenders, (
        "test modules that import other test modules (move what they share "
        f"to tests/helpers.py or a helper module): {offenders}"
    )


def test_the_check_sees_every_spelling_of_such_an_import(tmp_path):
    path = tmp_path / "test_example.py"
    path.write_text(
        "import tests.test_a\n"
        "from tests import test_b, helpers\n"
        "from tests.test_c import helper\n"
        "from .test_d import helper\n"
        "from . import test_e\n"
        "from tests.helpers import ROOT\n"
        "import tests.engine_runs\n"
        "def later():\n"
        "    from tests.test_f import helper\n"
    )
    assert _imported_test_modules(str(path)) == {
        f"tests.test_{letter}" for letter in "abcdef"
    }


def _uses_of_tests(path):
    """What the file at `path` imports from `tests/` or runs of it (paths)."""
    imports = {n for n in _imported_modules(path) if n.split(".")[0] == "tests"}
    tree = _parsed(path)
    docstrings = {  # They may name a test.
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    paths = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and (node.value == "tests" or "tests/" in node.value)
    }
    return imports | paths


def test_the_benchmarks_stand_without_the_tests():
    """bench/ neither imports tests/ nor runs a file of it: the tests may."""
    offenders = _offenders("bench/*.py", 10, _uses_of_tests)
    assert not offenders, (
        "benchmarks that use tests/ (move what they need to bench/, or to "
        f"tf_resnet/ where it is the product's): {offenders}"
    )


def test_the_bench_check_sees_imports_and_paths(tmp_path):
    path = tmp_path / "bench_example.py"
    path.write_text(
        '"""Named in a docstring: tests/test_x.py."""\n'
        "import os\n"
        "from tests import hvd_worker\n"
        "def later():\n"
        '    """Or here: tests/test_y.py."""\n'
        "    from tests.helpers import load_data_script\n"
        "WORKER = os.path.join(ROOT, 'tests', 'worker.py')\n"
        "OTHER = f'{ROOT}/tests/other.py'\n"
    )
    assert _uses_of_tests(str(path)) == {
        "/tests/other.py",
        "tests",
        "tests.helpers",
        "tests.helpers.load_data_script",
        "tests.hvd_worker",
    }

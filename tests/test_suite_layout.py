"""The test suite's own layout: a test module imports no other one, and
the benchmarks use nothing of the tests; and the benchmarks' own: no
function and no cell of their tables over its length limit.

What two test modules share lives in `tests/helpers.py` or in a helper
module named for what it holds (`data_files`, `engine_runs`,
`slurm_cluster`), so a test module can be read, run and changed alone.
"""

import ast
import glob
import os
import re

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


# A benchmark's function longer than this holds more than one step of it.
_LONGEST_FUNCTION = 100
# A cell of bench/README.md's tables longer than this tells a story that
# belongs on a results page.
_LONGEST_CELL = 300


def _long_functions(path):
    """`["name (lines)"]` of the functions in `path` over the limit."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(_parsed(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > _LONGEST_FUNCTION
    ]


def test_no_benchmark_function_is_longer_than_its_limit():
    offenders = _offenders("bench/*.py", 10, _long_functions)
    assert not offenders, (
        f"benchmark functions over {_LONGEST_FUNCTION} lines (split them "
        f"into their steps): {offenders}"
    )


def test_the_length_check_counts_a_function_from_def_to_its_last_line(
    tmp_path,
):
    path = tmp_path / "bench_example.py"
    body = "    x = 1\n" * (_LONGEST_FUNCTION - 2)
    path.write_text(
        f'def short():\n    """Doc."""\n{body}\n'
        f'def long():\n    """Doc."""\n{body}    return x\n'
    )
    assert _long_functions(str(path)) == [
        f"long ({_LONGEST_FUNCTION + 1} lines)"
    ]


def _long_cells(text):
    """`[(line number, length)]` of the Markdown table cells over the limit."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            continue
        for cell in re.split(r"(?<!\\)\|", line.strip().strip("|")):
            if len(cell.strip()) > _LONGEST_CELL:
                found.append((number, len(cell.strip())))
    return found


def test_the_bench_tables_keep_their_cells_short():
    with open(os.path.join(ROOT, "bench", "README.md")) as stream:
        long_cells = _long_cells(stream.read())
    assert not long_cells, (
        f"bench/README.md cells over {_LONGEST_CELL} characters (line, "
        f"length; move the story to the results page): {long_cells}"
    )


def test_the_cell_check_measures_each_cell_alone():
    long = "x" * (_LONGEST_CELL + 1)
    text = (
        f"| a | {'y' * _LONGEST_CELL} |\n| `a \\| b` | {long} |\nprose {long}\n"
    )
    assert _long_cells(text) == [(2, _LONGEST_CELL + 1)]

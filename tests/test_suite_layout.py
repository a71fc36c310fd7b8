"""The test suite's own layout: a test module imports no other one.

What two test modules share lives in `tests/helpers.py` or in a helper
module named for what it holds (`data_files`, `engine_runs`,
`slurm_cluster`), so a test module can be read, run and changed alone.
"""

import ast
import glob
import os

from tests.helpers import ROOT


def _imported_test_modules(path):
    """The `tests.test_*` modules the file at `path` imports, anywhere in it."""
    with open(path) as stream:
        tree = ast.parse(stream.read(), filename=path)
    found = set()
    for node in ast.walk(tree):
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
        for name in names:
            parts = name.split(".")
            if parts[0] == "tests" and parts[1:2] and parts[1][:5] == "test_":
                found.add(".".join(parts[:2]))
    return found


def test_no_test_module_imports_another_test_module():
    paths = sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py")))
    assert len(paths) > 40, paths  # The glob found the suite.
    offenders = {
        os.path.relpath(path, ROOT): sorted(_imported_test_modules(path))
        for path in paths
    }
    offenders = {path: names for path, names in offenders.items() if names}
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

"""What users read names no issue of this project and no workshop folder.

Docs, bench pages, the front page and the package's own messages are read
by people who never saw this project's tracker or the machines it was
built on, so "issue 2", "#35", "the issue's targets" or `../shared/data`
mean nothing to them. Upstream references (`horovod issue 4290`,
`horovod#779`, `tensorflow/tensorflow#61816`) stay: a reader can follow
those.
"""

import os
import re

import pytest

from tests.helpers import ROOT

# The trees users read; each file of these kinds in them.
_TREES = ("README.md", "docs", "bench", "tf_resnet", "scripts", "data")
_KINDS = (".md", ".py", ".sh", ".sbatch", ".pbs", ".slurm", ".txt")
# Projects whose issue numbers a reader can look up: "horovod issue 4290".
_UPSTREAM = re.compile(
    r"\b(?:horovod|keras|tensorflow|ray|absl|pytorch|torchvision)(?:'s)?\s+$",
    re.I,
)
_WORDS = {
    # "issue 2", "issue #35", "(issue\n2)"; not "horovod issue 4290".
    "an issue number": re.compile(r"\bissues?\s+#?\d+", re.I),
    # "#35" alone; not "horovod#779", "ray-project/ray#53727", "md#1-a".
    "a bare #number": re.compile(r"(?<![\w/.-])#\d+\b(?!-)"),
    "the issue's ...": re.compile(r"\bthe\s+issue's\b", re.I),
    "the ... issue": re.compile(r"\bthe\s+(?:recipe|course)\s+issue\b", re.I),
    "a workshop folder": re.compile(r"\.\./shared\b"),
    "the development machines": re.compile(r"\bdevelopment\s+machines?", re.I),
}


def _read_files():
    """(path relative to the root, text) of every file users read."""
    for tree in _TREES:
        top = os.path.join(ROOT, tree)
        if os.path.isfile(top):
            paths = [top]
        else:
            paths = [
                os.path.join(folder, name)
                for folder, _, names in os.walk(top)
                for name in names
                if name.endswith(_KINDS)
            ]
        for path in sorted(paths):
            with open(path, encoding="utf-8") as stream:
                yield os.path.relpath(path, ROOT), stream.read()


def _found(text):
    """(what, the line's text) of each word of the workshop in `text`."""
    for what, pattern in _WORDS.items():
        for match in pattern.finditer(text):
            before = text[max(0, match.start() - 20) : match.start()]
            if _UPSTREAM.search(before):
                continue
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            yield what, text[start : end if end >= 0 else None].strip()


def test_no_workshop_words_in_what_users_read():
    files = dict(_read_files())
    assert "docs/usage.md" in files and "tf_resnet/scaling.py" in files
    found = [
        f"{path}: {what}: {line}"
        for path, text in files.items()
        for what, line in _found(text)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "measured when the project was planned (issue\n2)",
        "as issue #35 quotes it",
        "the reference of the recipe issue gave",
        "Against the issue's targets:",
        "BENCH_DATA_DIR=../shared/data python bench/x.py",
        "on the development machines",
        "see #35 for why",
    ],
)
def test_the_check_finds_each_kind(text):
    assert list(_found(text)), text


@pytest.mark.parametrize(
    "text",
    [
        "Keras 3 variables lack (horovod issue 4290).",
        "tensorflow/tensorflow#61816, ray#25141, horovod#779, keras#19012",
        "[front page](../README.md#1-the-original-example)",
        "a pass/fail table to paste into an issue.",
    ],
)
def test_upstream_references_pass(text):
    assert not list(_found(text)), text


def test_the_docs_commands_start_with_the_checkouts_interpreter():
    """A command a student copies from the docs runs `.venv/bin/python`: a
    bare `python` may be one without TensorFlow. (Commands that a launcher
    runs on other hosts, indented under it, take that host's PATH.)"""
    bare = [
        (path, line)
        for path, text in _read_files()
        if path == "README.md" or path.startswith("docs")
        for line in text.splitlines()
        if line.startswith("python ")
    ]
    assert not bare, bare

"""What of a SWE task's graded tree reaches the grading sandbox (envs/swe_tasks.py): the package
sources, never a test file, since code the agent wrote runs there and could read the expected
values (a red-team pass did: tests/e2e/test_swe_env.py keeps that attack). A hidden test whose
imports need a test module cannot be graded without one, so it is refused by name instead of
failing every episode quietly. A file the test patch touches is graded as the instance has it,
whatever the agent left there."""

from __future__ import annotations

import base64
import io
import tarfile

import pytest

from agentrl.envs.swe import _MAX_TREE_FILES, _untar
from agentrl.envs.swe_tasks import graded_tree, grading_files, hidden_tests

TREE = {
    "pkg/__init__.py": "",
    "pkg/mod.py": "def f(x):\n    return x\n",
    "tests/__init__.py": "",
    "tests/helpers.py": "EXPECTED = 3\n",
    "tests/test_mod.py": "from pkg.mod import f\n\ndef test_f():\n    assert f(3) == 3\n",
    "conftest.py": "",
    "test_top.py": "from pkg.mod import f\n\ndef test_g():\n    assert f(1) == 1\n",
}
PATCH = "--- a/tests/test_mod.py\n+++ b/tests/test_mod.py\n@@ -0,0 +1 @@\n+x\n"


def test_the_grading_sandbox_gets_the_sources_and_no_test_file():
    assert sorted(grading_files(TREE, PATCH)) == ["pkg/__init__.py", "pkg/mod.py"]


@pytest.mark.parametrize(
    "line",
    ["from tests.helpers import EXPECTED", "from .helpers import EXPECTED",
     "import tests.helpers", "from tests import helpers"],
)  # fmt: skip
def test_a_test_that_imports_from_the_tests_is_refused_by_name(line):
    tree = {**TREE, "tests/test_mod.py": f"{line}\nfrom pkg.mod import f\n\ndef test_f():\n"
            "    assert f(3) == 3\n"}  # fmt: skip
    with pytest.raises(ValueError, match="imports from the tests"):
        hidden_tests(tree, ["tests/test_mod.py::test_f"])
    ((imports, tests),) = hidden_tests(TREE, ["tests/test_mod.py::test_f"]).values()
    assert imports == "from pkg.mod import f" and tests[0].call == "f(3)"


# a test file whose name is no test's (Django's app/tests.py), and a test patch that adds a
# hidden check in the middle of it (trailing context: it applies above what follows)
SNAP = {
    "pkg/__init__.py": "",
    "pkg/mod.py": "def double(x):\n    return x\n",
    "pkg/tests.py": "from pkg.mod import double\n\n\ndef test_zero():\n    assert double(0) == 0"
    "\n\n\ndef test_last():\n    assert double(0) == 0\n",
}
MID_PATCH = """--- a/pkg/tests.py
+++ b/pkg/tests.py
@@ -5,5 +5,9 @@ def test_zero():
     assert double(0) == 0
 
 
+def test_two():
+    assert double(2) == 4
+
+
 def test_last():
     assert double(0) == 0
"""


def test_the_agent_cannot_redefine_a_hidden_check_in_a_patched_file():
    override = "\n\ndef test_two():\n    assert double(2) == 2\n"  # what the bug returns
    agent = {**SNAP, "pkg/tests.py": SNAP["pkg/tests.py"] + override,
             "pkg/mod.py": "def double(x):\n    return 2 * x\n"}  # fmt: skip
    tree = graded_tree(SNAP, agent, MID_PATCH)
    ((_, (check,)),) = hidden_tests(tree, ["pkg/tests.py::test_two"]).values()
    assert (check.call, check.expected) == ("double(2)", 4)
    assert tree["pkg/mod.py"] == agent["pkg/mod.py"]  # the agent's source change is graded
    assert "pkg/mod.py" not in graded_tree(SNAP, {"pkg/__init__.py": ""}, MID_PATCH)  # deleted


def test_a_file_the_hidden_ids_name_is_the_instances_and_never_enters_the_sandbox():
    """The same attack on a check the test patch does not touch: `pkg/tests.py::test_two` is in
    the snapshot already (a FAIL_TO_PASS id of an instance whose patch adds nothing there). The
    agent's appended def is not graded, and the file, holding the expected values, stays out
    of the grading sandbox where the agent's code runs."""
    snap = {**SNAP, "pkg/tests.py": SNAP["pkg/tests.py"]
            + "\n\ndef test_two():\n    assert double(2) == 4\n"}  # fmt: skip
    override = "\n\ndef test_two():\n    assert double(2) == 2\n"
    agent = {**snap, "pkg/tests.py": snap["pkg/tests.py"] + override}
    ids = ["pkg/tests.py::test_two", "pkg/tests.py::test_zero"]
    tree = graded_tree(snap, agent, "", ids)
    ((_, checks),) = hidden_tests(tree, ids).values()
    assert [(c.call, c.expected) for c in checks] == [("double(2)", 4), ("double(0)", 0)]
    assert "pkg/tests.py" not in grading_files(tree, "", ids)
    assert "pkg/tests.py" in grading_files(tree, "")  # without the ids it would have gone in


def test_a_check_reading_the_test_files_own_names_is_refused_by_name():
    """A red-team pass: `assert roundtrip(3)` and `assert f(CASES) == [1, 2]` read a helper and
    a constant of the test file, which the grading sandbox never gets; there, through the test
    file's `from pkg.mod import *`, they were the agent's to define (`roundtrip = lambda x:
    True` passed), and without a star import an honest fix failed on a NameError, quietly."""
    body = ("CASES = [1, 2]\ndef roundtrip(x):\n    return f(x) == x\n"
            "def test_a():\n    assert roundtrip(3)\ndef test_b():\n    assert f(CASES) == [1, 2]\n")  # fmt: skip
    tree = {**TREE, "tests/test_mod.py": "from pkg.mod import *\n" + body}
    for name, read in (("test_a", "roundtrip"), ("test_b", "CASES")):
        with pytest.raises(ValueError, match=f"reads {read}, which the test file defines"):
            hidden_tests(tree, [f"tests/test_mod.py::{name}"])
    assert hidden_tests(TREE, ["tests/test_mod.py::test_f"])  # imported names stay gradable


@pytest.mark.parametrize("spelling", ["pkg//tests.py", "pkg/./tests.py", "./pkg/tests.py"])
def test_another_spelling_of_a_hidden_check_file_is_not_the_agents(spelling):
    """A red-team pass: the read-back of the agent's files runs in its own session, whose
    interpreter its shell can rewrite (its /proc/<pid>/mem opened read-write from a bash call),
    so a name in it is the agent's word. `pkg//tests.py` passed as a source file of the package (not the
    instance's `pkg/tests.py` by name), was written over it on the host before the test patch,
    and its later `def test_two` replaced the hidden check."""
    override = "\n\ndef test_two():\n    assert double(2) == 2\n"
    agent = {**SNAP, spelling: SNAP["pkg/tests.py"] + override,
             "pkg/mod.py": "def double(x):\n    return x\n"}  # fmt: skip
    tree = graded_tree(SNAP, agent, MID_PATCH)
    ((_, (check,)),) = hidden_tests(tree, ["pkg/tests.py::test_two"]).values()
    assert (check.call, check.expected) == ("double(2)", 4)
    assert sorted(tree) == sorted(SNAP)


def test_a_read_back_of_too_many_files_is_refused_as_it_is_read():
    """48 KB of gzip (what a session's output carries) held 21,000 empty tar members: listing
    them all held the trainer's event loop 1.1 s. Past 1,000 members it stops, unreadable."""

    def blob(n: int) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            for i in range(n):
                t.addfile(tarfile.TarInfo(f"pkg/m{i}.py"), io.BytesIO(b""))
        return base64.b64encode(buf.getvalue()).decode()

    assert _untar(blob(3)) == {"pkg/m0.py": "", "pkg/m1.py": "", "pkg/m2.py": ""}
    assert _untar(blob(_MAX_TREE_FILES + 1)) is None

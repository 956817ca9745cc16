"""What of a SWE task's graded tree reaches the grading sandbox (envs/swe_tasks.py): the package
sources, never a test file, since code the agent wrote runs there and could read the expected
values (a red-team pass did: tests/e2e/test_swe_env.py keeps that attack). A hidden test whose
imports need a test module cannot be graded without one, so it is refused by name instead of
failing every episode quietly."""

from __future__ import annotations

import pytest

from agentrl.envs.swe_tasks import grading_files, hidden_tests

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

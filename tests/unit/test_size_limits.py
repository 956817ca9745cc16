"""Issue 39's size limits: no library module over 500 lines unless its docstring says why in a
sentence starting "Size:" (one cohesive thing: a state machine, a family sharing one record), and
no function over 60 lines (def line to last line, decorators excluded; nested functions and
methods count on their own). Split along real seams: a function doing two jobs becomes two named
steps, a module with two roles two modules, each imported by its own name (no re-export shims).

Walks agentrl/ and the top-level envs/, tools/, sandbox/ (agentrl/envs, agentrl/tools and
agentrl/sandbox are links to those, walked once)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentrl", "envs", "tools", "sandbox")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
SIZE_REASON = re.compile(r"(?m)^Size: \S")


def _modules() -> list[Path]:
    """Every .py file of the packages, relative to ROOT, the linked directories left out."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            linked = any(
                (ROOT / Path(*rel.parts[:i])).is_symlink() for i in range(1, len(rel.parts))
            )
            if not linked and "__pycache__" not in rel.parts:
                out.append(rel)
    return out


def _problems(rel: Path) -> list[str]:
    """What in this module breaks a limit, one line each."""
    source = (ROOT / rel).read_text()
    tree = ast.parse(source)
    out = []
    n_lines = len(source.splitlines())
    if n_lines > MAX_MODULE_LINES and not SIZE_REASON.search(ast.get_docstring(tree) or ""):
        out.append(
            f"{rel}: {n_lines} lines, over {MAX_MODULE_LINES}: split it along a real seam, or "
            'say why it is one thing in a docstring sentence starting "Size:"'
        )
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(
                    f"{rel}:{node.lineno} {node.name}: {length} lines, over "
                    f"{MAX_FUNCTION_LINES}: make its jobs named steps"
                )
    return out


def test_the_walk_sees_every_package_once():
    mods = {str(m) for m in _modules()}
    assert {"agentrl/train.py", "sandbox/service.py", "envs/code_exec.py"} <= mods
    assert not any(
        m.startswith(("agentrl/envs/", "agentrl/tools/", "agentrl/sandbox/")) for m in mods
    )


def test_modules_and_functions_are_within_the_limits():
    problems = [p for rel in _modules() for p in _problems(rel)]
    assert not problems, "\n".join(problems)


def test_the_trainer_keeps_the_algorithm_and_no_more():
    """Issue 39's bounds: `Trainer` at most 12 methods (its parts are handed to it: groups.py,
    handover.py, guards.py), and `Trainer.step` reads as the algorithm in at most 40 lines."""
    tree = ast.parse((ROOT / "agentrl" / "train.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    methods = {
        n.name: n for n in trainer.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert len(methods) <= 12, sorted(methods)
    step = methods["step"]
    assert step.end_lineno - step.lineno + 1 <= 40

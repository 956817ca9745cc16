"""The import boundary of DESIGN.md (Layout), kept by walking the AST of agentrl/, envs/, tools/
and sandbox/. Every import statement counts: top-level, function-local and `if TYPE_CHECKING:`
ones alike, so a cycle cannot hide behind a lazy import.

- no import cycles between modules;
- layers: records (torch-free) ← library ← assembly (run.py, run_learners.py) ← entry points
  (train.py, cli/, config.py); a module imports only its own layer or those below (config.py:
  entry points and the assembly only);
- ray / torch.distributed / sglang only in agentrl/learner/, weight_sync.py, the dev server and the
  engine launcher; Hydra / OmegaConf only in the entry points;
- a wing (agentrl/engine/) is imported from outside only through its `__init__.py`;
- fewer than 10 function-local imports of our own modules, each with a `# local: why` comment;
- no parameter or attribute named `cfg` annotated `Any` (the way past the layers above: a
  module that needs settings takes its own typed section, or plain values);
- no method name crosses the Ray boundary as a string: the driver calls a learner rank's method
  as an attribute (`w.memory_stats.remote()`) and a transport's rank half by reference
  (`learner.on_ranks(TensorSync.Rank, TensorSync.Rank.bucket, …)`), so a type checker and a
  reader follow every call (`string_dispatch`).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentrl", "envs", "tools", "sandbox")
SIDES = ("agentrl.envs", "agentrl.tools", "agentrl.sandbox")  # imported so (agentrl/ links them)

RECORDS = {"agentrl", "agentrl.types", "agentrl.env", "agentrl.task_file", "agentrl.agent_env",
           "agentrl.tool", "agentrl.parsers", "agentrl.render", "agentrl.markup", "agentrl.registry",
           "agentrl.fastpath", "agentrl.repeats"}  # fmt: skip
RECORD_PACKAGES = ("agentrl.parsers",)  # their modules are records too (one per tool-call format)
ENTRY = ("agentrl.train", "agentrl.cli", "agentrl.config")
ASSEMBLY = ("agentrl.run", "agentrl.run_learners")
HEAVY = ("ray", "torch.distributed", "sglang")
HEAVY_OK = ("agentrl.learner", "agentrl.weight_sync", "agentrl.engine.dev", "agentrl.engine.fleet")
WINGS = (
    "agentrl.engine",
    "agentrl.gateway",
)  # packages whose modules are private: others import the package only
CONFIG = ("hydra", "omegaconf", "agentrl.config")
CONFIG_OK = (*ENTRY, *ASSEMBLY)
MAX_LOCAL = 10


@dataclass
class Edge:
    src: str
    dst: str  # the imported name, resolved to one of our modules when it is one
    kind: str  # top | local | typecheck
    line: int
    text: str  # the source line, for the reason comment


@dataclass
class Graph:
    modules: dict[str, Path]
    edges: list[Edge] = field(default_factory=list)

    def ours(self, name: str) -> str | None:
        """The module of ours that `name` (a module or module.attr) lives in, if any."""
        while name and name not in self.modules:
            name = name.rpartition(".")[0]
        return name or None


def _under(name: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def build_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> Graph:
    modules: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if pkg == "agentrl" and (root / "agentrl" / parts[1]).is_symlink():
                continue  # agentrl/{envs,tools,sandbox}: walked as the top-level folders below
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name if pkg == "agentrl" else f"agentrl.{name}"] = path  # imported so
    g = Graph(modules)
    for name, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        is_pkg = path.name == "__init__.py"

        def visit(node: ast.AST, kind: str, name: str = name, lines=lines, is_pkg=is_pkg) -> None:
            for child in ast.iter_child_nodes(node):
                k = kind
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    k = "local"
                elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    k = "typecheck" if kind == "top" else kind
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    text = lines[child.lineno - 1]
                    for dst in _targets(child, name, is_pkg):
                        g.edges.append(Edge(name, dst, k, child.lineno, text))
                visit(child, k)

        visit(ast.parse(source), "top")
    return g


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        pkg = module.split(".") if is_pkg else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join([*pkg, *([node.module] if node.module else [])])
    return [f"{base}.{a.name}" for a in node.names]


def cycles(g: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), plus self-imports."""
    adj: dict[str, set[str]] = defaultdict(set)
    for e in g.edges:
        dst = g.ours(e.dst)
        if dst is not None and dst != e.src:
            adj[e.src].add(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(adj[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g.modules):
        if v not in index:
            strong(v)
    return out


def is_record(module: str) -> bool:
    return module in RECORDS or _under(module, RECORD_PACKAGES)


def layer(module: str) -> int:
    if is_record(module):
        return 0
    if _under(module, ASSEMBLY):
        return 2
    if _under(module, ENTRY):
        return 3
    return 1  # the library, and envs/, tools/, sandbox/ (checked apart)


def violations(g: Graph) -> list[str]:
    bad = []
    for e in g.edges:
        where = f"{e.src}:{e.line} imports {e.dst}"
        dst = g.ours(e.dst)
        if _under(e.dst, HEAVY) and not _under(e.src, HEAVY_OK):
            bad.append(f"{where}: ray/torch.distributed/sglang belong in {HEAVY_OK}")
        if _under(e.dst, CONFIG) and not _under(e.src, CONFIG_OK):
            bad.append(f"{where}: the config and Hydra stay in the entry points and the assembly")
        if is_record(e.src) and _under(e.dst, ("torch",)):
            bad.append(f"{where}: the records layer is torch-free")
        if dst is None or dst == e.src:
            continue
        for wing in WINGS:
            if dst.startswith(wing + ".") and not _under(e.src, (wing,)):
                bad.append(f"{where}: import what {wing}/__init__.py exports, not its modules")
        if _under(e.src, SIDES):
            if not _under(dst, SIDES) and layer(dst):
                bad.append(f"{where}: envs/, tools/ and sandbox/ use only the records layer")
        elif not _under(dst, SIDES) and dst != "agentrl.config" and layer(dst) > layer(e.src):
            bad.append(f"{where}: a lower layer imports a higher one")
    return bad


def _is_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.strip() in ("Any", "typing.Any")  # a quoted annotation
    return ast.unparse(annotation) in ("Any", "typing.Any", "t.Any")


def any_configs(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """`cfg: Any`: parameters, class attributes and `self.cfg: Any = …` named cfg."""
    bad: list[tuple[str, int, str]] = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            where = path.relative_to(root)
            if pkg == "agentrl" and (root / "agentrl" / where.parts[1]).is_symlink():
                continue  # agentrl/{envs,tools,sandbox}: walked as the top-level folders
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.arg) and node.arg == "cfg" and _is_any(node.annotation):
                    bad.append((str(where), node.lineno, "parameter"))
                elif isinstance(node, ast.AnnAssign) and _is_any(node.annotation):
                    target = node.target
                    name = target.attr if isinstance(target, ast.Attribute) else (
                        target.id if isinstance(target, ast.Name) else "")  # fmt: skip
                    if name == "cfg":
                        bad.append((str(where), node.lineno, "attribute"))
    return [f"{f}:{line}: {what} cfg: Any" for f, line, what in sorted(bad)]


def local_imports(g: Graph) -> list[Edge]:
    """Function-local imports of our own modules."""
    return [e for e in g.edges if e.kind == "local" and g.ours(e.dst) is not None]


# string-dispatch fan-outs (the old LearnerGroup API and its relatives): a literal first argument
# is a method name looked up on the far side
DISPATCHERS = {"call", "call_async", "call_rank0", "call_per_rank", "sync_call", "rank_call"}
WORKERISH = {"w", "worker", "self.worker"}


def _is_str(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _remote_ok(target: ast.expr) -> bool:
    """`X.remote(...)` is fine when X is a method named as an attribute (`w.offload`,
    `self.workers[0].node`) or an actor or task being made (`ray.remote(C).options(...)`)."""
    if isinstance(target, ast.Attribute) or ast.unparse(target) == "ray":  # ray.remote(C)
        return True
    if isinstance(target, ast.Call):
        f = target.func
        return ast.unparse(f) == "ray.remote" or (isinstance(f, ast.Attribute)
                                                   and f.attr == "options")  # fmt: skip
    return False


def string_dispatch(root: Path, package: str = "agentrl") -> list[str]:
    """Calls that name a method by a string where it crosses to a Ray actor: a string-literal
    first argument to a dispatcher (`g.call("memory_stats")`, `sync_call("tensor", "bucket")`),
    `.remote` on anything but an attribute (`getattr(w, name).remote()`), `.remote` on a
    dispatcher (`w.sync_call.remote(name, …)`), and, in learner code,
    `getattr` on a worker or a getattr'd method called at once (`getattr(state, method)(...)`;
    torch's own switches aside)."""
    bad: list[tuple[str, int, str]] = []
    for path in sorted((root / package).rglob("*.py")):
        where = path.relative_to(root)
        if (root / package / where.parts[1]).is_symlink():
            continue  # agentrl/{envs,tools,sandbox}: no Ray there
        learner = where.parts[1] == "learner"
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f, text = node.func, ast.unparse(node)[:80]
            named = node.args and _is_str(node.args[0])
            if isinstance(f, ast.Attribute) and f.attr in DISPATCHERS and named:
                bad.append((str(where), node.lineno, f"method named by a string: {text}"))
            if isinstance(f, ast.Attribute) and f.attr == "remote":
                if not _remote_ok(f.value):
                    bad.append((str(where), node.lineno, f".remote on a looked-up method: {text}"))
                elif isinstance(f.value, ast.Attribute) and f.value.attr in DISPATCHERS:
                    bad.append((str(where), node.lineno, f"a dispatcher over Ray: {text}"))
            if learner and isinstance(f, ast.Call) and ast.unparse(f.func) == "getattr":
                obj, name = f.args[0], f.args[1]
                if not _is_str(name) and not ast.unparse(obj).startswith("torch."):
                    bad.append((str(where), node.lineno, f"a method called by name: {text}"))
            if learner and ast.unparse(f) == "getattr" and node.args:
                obj = ast.unparse(node.args[0])
                if obj in WORKERISH or "workers" in obj:
                    bad.append((str(where), node.lineno, f"getattr on a worker: {text}"))
    return [f"{f}:{line}: {what}" for f, line, what in sorted(bad)]


# -- the tests ----------------------------------------------------------------------------------


def test_no_import_cycles() -> None:
    assert cycles(build_graph(ROOT)) == []


def test_layers_and_heavy_imports_stay_where_they_belong() -> None:
    assert violations(build_graph(ROOT)) == []


def test_few_function_local_imports_each_with_a_reason() -> None:
    local = local_imports(build_graph(ROOT))
    assert len(local) < MAX_LOCAL, [f"{e.src}:{e.line}" for e in local]
    unexplained = [f"{e.src}:{e.line}" for e in local if "# local:" not in e.text]
    assert unexplained == [], "say why on the line: `# local: <reason>`"


def test_no_config_typed_any() -> None:
    assert any_configs(ROOT) == [], "type it: the section it needs (TrainerConfig, …) or values"


def test_the_any_check_catches_each_form(tmp_path: Path) -> None:
    pkg = tmp_path / "agentrl"
    pkg.mkdir()
    (pkg / "parts.py").write_text(
        "from typing import Any\nimport typing\n\n"
        "class Mixin:\n    cfg: Any\n\n"
        "    def __init__(self, cfg: 'Any', other: Any) -> None:\n        self.cfg: typing.Any = cfg\n\n"
        "def f(*, cfg: Any = None, config: Any = None) -> None: ...\n"
        "def ok(cfg: dict[str, Any]) -> None: ...\n"
    )
    assert any_configs(tmp_path, ("agentrl",)) == [
        "agentrl/parts.py:5: attribute cfg: Any",
        "agentrl/parts.py:7: parameter cfg: Any",
        "agentrl/parts.py:8: attribute cfg: Any",
        "agentrl/parts.py:10: parameter cfg: Any",
    ]


def test_the_checks_catch_a_planted_cycle_and_breaches(tmp_path: Path) -> None:
    pkg = tmp_path / "agentrl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "batch.py").write_text("from agentrl.loss import LossNorm\n")
    (pkg / "loss.py").write_text(
        "def f():\n    from agentrl.batch import TrainBatch  # hidden in a function\n"
    )
    (pkg / "rollout.py").write_text(
        "from typing import TYPE_CHECKING\nimport ray\nif TYPE_CHECKING:\n    import hydra\n"
    )
    (pkg / "types.py").write_text("import torch\nfrom agentrl.rollout import x\n")
    (pkg / "engine").mkdir()
    (pkg / "engine" / "__init__.py").write_text("from agentrl.engine.client import Client\n")
    (pkg / "engine" / "client.py").write_text("from agentrl.types import x\n")
    (pkg / "evaluate.py").write_text(
        "from agentrl.engine import Client\nimport agentrl.engine.client\n"
    )
    g = build_graph(tmp_path, ("agentrl",))
    assert cycles(g) == [["agentrl.batch", "agentrl.loss"]]
    found = "\n".join(violations(g))
    assert "agentrl.rollout:2 imports ray" in found
    assert "agentrl.rollout:4 imports hydra" in found
    assert "agentrl.types:1 imports torch: the records layer is torch-free" in found
    assert "agentrl.types:2 imports agentrl.rollout.x: a lower layer" in found
    assert "agentrl.evaluate:1" not in found  # the package's exports are its public face
    assert "agentrl.evaluate:2 imports agentrl.engine.client: import what agentrl.engine" in found
    assert found.count("import what") == 1  # the package's own modules import each other freely
    assert [(e.src, e.kind) for e in local_imports(g)] == [("agentrl.loss", "local")]


def test_no_method_name_crosses_the_ray_boundary_as_a_string() -> None:
    assert string_dispatch(ROOT) == [], "call the method as an attribute, or pass it by reference"


def test_the_dispatch_check_catches_each_form(tmp_path: Path) -> None:
    """Today's typed calls pass; each string-dispatch form of the old API is caught."""
    (tmp_path / "agentrl" / "learner").mkdir(parents=True)
    (tmp_path / "agentrl" / "run.py").write_text(
        "g.call('memory_stats')\n"  # 1
        "g.call_rank0('model_dtype')\n"  # 2
        "g.memory_stats()\n"
        "http.call(s, 'GET', '/health')\n"  # a first argument that is no method name
        "actor = ray.remote(Server).options(num_cpus=1).remote(cfg)\n"
    )
    (tmp_path / "agentrl" / "learner" / "group.py").write_text(
        "refs = [getattr(w, method).remote(*args) for w in self.workers]\n"  # 1
        "x = getattr(self.workers[0], 'node')\n"  # 2
        "self.call_async('sync_call', self.name, 'release')\n"  # 3
        "refs = [w.offload.remote() for w in self.workers]\n"
        "ref = self.workers[0].on_rank.remote(cls, fn, 1)\n"
        "w.sync_call.remote('tensor', 'join')\n"  # 4
        "m = w.node\nm.remote()\n"  # 5: a name, not an attribute
    )
    (tmp_path / "agentrl" / "learner" / "worker.py").write_text(
        "out = getattr(self._transports[transport], method)(*args)\n"  # 1
        "getattr(torch.backends.cuda, f'enable_{name}_sdp')(True)\n"
        "pad = getattr(mb, 'is_padding', False)\n"
        "fn(self._rank_states[cls], *args)\n"
    )
    found = string_dispatch(tmp_path)
    lines = sorted({f.split(": ", 1)[0] for f in found})
    assert lines == [
        "agentrl/learner/group.py:1", "agentrl/learner/group.py:2", "agentrl/learner/group.py:3",
        "agentrl/learner/group.py:6", "agentrl/learner/group.py:8", "agentrl/learner/worker.py:1",
        "agentrl/run.py:1", "agentrl/run.py:2",
    ], found  # fmt: skip

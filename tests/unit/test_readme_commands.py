"""The README's and docs/'s commands stay true: every `agentrl train|preview` /
`python -m agentrl.train` command in their fenced blocks composes and validates (the README's own
`my_env.AddEnv`, written from its Python block, included). What they then run is tested end to end
elsewhere; here a renamed key, a dropped config group or a stale example fails at once."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from agentrl.config import compose, training_checks
from agentrl.env_config import MixtureConfig

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
RUNS = ("agentrl train", "agentrl preview", "python -m agentrl.train")


def fenced(lang: str, pages: list[Path] = PAGES) -> list[str]:
    blocks = rf"```{lang}\n(.*?)```"
    return [b for page in pages for b in re.findall(blocks, page.read_text(), flags=re.S)]


def commands(pages: list[Path] = PAGES) -> list[str]:
    out = []
    for block in fenced("bash", pages):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].split(" # ")[0].strip()
            line = line.split("&&")[-1].strip()
            line = re.sub(r"^\w+=\S+ ", "", line)  # WANDB_API_KEY=… python -m …
            if line.startswith(RUNS):
                out.append(line)
    return out


@pytest.fixture
def my_env(tmp_path, monkeypatch):
    """The user modules of the README and docs/, saved as they tell the user to: the AddEnv block
    as my_env.py, a block that starts with `# name.py` as name.py."""
    written = []
    for block in fenced("python"):
        name = "my_env" if "class AddEnv" in block else None
        if m := re.match(r"# (\w+)\.py", block):
            name = m.group(1)
        if name:
            (tmp_path / f"{name}.py").write_text(block)
            written.append(name)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield written
    for name in written:
        sys.modules.pop(name, None)


def test_the_readme_has_its_commands():
    assert len(commands()) >= 10 and any("my_env.AddEnv" in c for c in commands([README]))


def test_the_readme_starts_with_the_two_set_up_commands():
    """Its first lines: install and train on the embedded default, install and run the tests."""
    first = README.read_text().split("```bash\n", 1)[1].split("```")[0].splitlines()
    assert [" ".join(line.split("#")[0].split()) for line in first] == [
        "pip install -e '.[dev]' && python -m agentrl.train env=code_exec",
        "pip install -e '.[dev]' && pytest -q",
    ]
    assert README.read_text().index("```bash") < README.read_text().index("\n## ")


@pytest.mark.parametrize("command", commands())
def test_each_readme_command_composes_and_validates(command, my_env, monkeypatch):
    words = shlex.split(command)
    modules = {m for m in re.findall(r"=(\w+)[:.]\w", command) if m.startswith("my_")}
    if modules - set(my_env):
        pytest.skip(f"{sorted(modules - set(my_env))}: a user module the README only names")
    start = 2 if words[0] == "agentrl" else 3
    overrides = [w for w in words[start:] if ("=" in w or w[0] == "~") and "…" not in w]
    cfg = compose(overrides)
    if words[:2] != ["agentrl", "preview"]:
        training_checks(cfg)
    if "my_env.AddEnv" in command:  # the user's own env loads its tasks (a mixture's member too)
        env = cfg.env.envs["add"] if isinstance(cfg.env, MixtureConfig) else cfg.env
        assert len(env.load_tasks(env.load_class())) == 100

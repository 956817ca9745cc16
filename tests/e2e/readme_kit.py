"""The README's own AddEnv, as a user would save it from the README's Python block."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_add_env(tool_name: str | None = None, arg_names: tuple[str, str] | None = None) -> str:
    """The source of the README's `my_env.py` (the Python block with `class AddEnv`); with
    `tool_name`, its tool renamed as a user would name theirs (the tool and the system prompt);
    with `arg_names`, its two arguments too (the schema and the tool's code)."""
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
                if "class AddEnv" in b]  # fmt: skip
    edits = []
    if tool_name is not None:
        edits += [('"add", "Add two integers."', f'"{tool_name}", "Add two integers."'),
                  ("the add tool", f"the {tool_name} tool")]  # fmt: skip
    if arg_names is not None:
        a, b = arg_names
        edits += [("        a: int\n", f"        {a}: int\n"), ("        b: int\n", f"        {b}: int\n"),
                  ("args.a + args.b", f"args.{a} + args.{b}")]  # fmt: skip
    for old, new in edits:
        assert block.count(old) == 1, f"the README's AddEnv no longer has {old!r}"
        block = block.replace(old, new)
    return block

"""The README's own AddEnv, as a user would save it from the README's Python block."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_add_env() -> str:
    """The source of the README's `my_env.py` (the Python block with `class AddEnv`)."""
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
                if "class AddEnv" in b]  # fmt: skip
    return block

"""Task files: JSON Lines, one task a line, read so that nothing in them is misread.

    {"id": "add-1", "prompt": "What is 2 + 3?", "answer": "5"}
    {"id": 2, "prompt": "What is 4 + 4?", "answer": "8"}      # an integer id is its text, "2"
    {"prompt": "What is 1 + 1?", "answer": "2"}                 # no id: its line's index, "2"

UTF-8, a BOM allowed (Windows editors write one), blank lines skipped. Each line's error names
the file, the line's number and the fix: a line that is not UTF-8, not JSON or not an object;
an object that holds one key twice (JSON keeps only the last, silently); NaN or Infinity (not
JSON, though Python's reader takes them); an id that is not a string or an integer, or is empty
(`null` became the id "None", `{"a": 1}` its repr, `1.0` the id "1.0" beside `1`'s "1").
`Env.load_tasks` reads these (agentrl/env.py); the SWE env's instances too (envs/swe_tasks.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.types import Task

_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "true/false"}


def jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index from 0, object) of each non-blank line of a JSONL file; a line that is not UTF-8,
    not JSON or not an object is a ValueError naming the file, the line's number and the fix."""
    first = True
    with path.open(encoding="utf-8-sig") as f:  # -sig: a BOM (Windows editors) is no text
        try:
            for i, line in enumerate(f):
                if line.strip():
                    yield i, _json_object(line, f"{path} line {i + 1}", _hint(path, first))
                    first = False
        except UnicodeDecodeError as e:  # decoded in blocks: find its line in the bytes
            lines = path.read_bytes().split(b"\n")
            bad = next((n for n, b in enumerate(lines, 1) if not _is_utf8(b)), len(lines))
            raise ValueError(f"{path} line {bad}: not UTF-8 ({e.reason}); save the file "
                             f"as UTF-8{_hint(path, bad == 1)}") from None  # fmt: skip


def read_tasks(path: Path, limit: int | None = None) -> list[Task]:
    """The tasks of a JSONL file (module docstring), the first `limit` of them."""
    tasks = []
    for i, obj in jsonl_objects(path):
        tasks.append(Task(id=task_id(obj.pop("id", i), f"{path} line {i + 1}"), data=obj))
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def task_id(value: Any, where: str) -> str:
    """A task's id as text: a string or an integer (its digits); else a ValueError at `where`."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    kind = "an empty string" if isinstance(value, str) else f"a JSON {_kind(value)}"
    raise ValueError(f"{where}: the id {json.dumps(value)[:60]} is {kind}: give each task an id "
                     "that is a non-empty string or an integer, or leave the key out (the line's "
                     "index)")  # fmt: skip


def _kind(value: Any) -> str:
    return "object" if isinstance(value, dict) else _JSON_KINDS.get(type(value), "null")


def _hint(path: Path, first: bool) -> str:
    """For the first line of a file that is not JSON Lines by its name: what is read."""
    if not first or path.suffix.lower() in (".jsonl", ".ndjson"):
        return ""
    return (f" ({path.name} is read as JSON Lines, one task object a line; convert a JSON array "
            "or a parquet file, e.g. pandas.read_parquet(p).to_json('tasks.jsonl', "
            "orient='records', lines=True))")  # fmt: skip


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return False
    return True


class _Refused(ValueError):
    """A line that is JSON to Python's reader, but not as its writer meant it."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Refused(f"the key {key!r} twice in one object (JSON keeps only the last): "
                           "keep the one you mean")  # fmt: skip
        seen.add(key)
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON (Python writes it for a float that is not finite): "
                   "write a number, null or a string")  # fmt: skip


def _json_object(line: str, where: str, hint: str = "") -> dict[str, Any]:
    try:
        obj = json.loads(line, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg} at column {e.colno}): each line is one "
                         f"task, a JSON object{hint}") from None  # fmt: skip
    except _Refused as e:
        raise ValueError(f"{where}: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a JSON {_kind(obj)}, not an object: each line is one task, "
                         f'{{"id": …, "prompt": …}}{hint}')  # fmt: skip
    return obj

"""`str_replace_editor`: view, create and edit files in the episode's sandbox.

    from agentrl.tools.editor import EditorTool
    tools = [EditorTool(max_output_chars=8000)]

The schema is the one common agent scaffolds (SWE-agent, OpenHands) give their models:
`command` is `view` (a file with line numbers, optionally `view_range: [start, end]`, end -1 for
the end; a directory two levels deep), `create` (`file_text`; refuses an existing file),
`str_replace` (`old_str` must occur exactly once, whitespace included: a missing or repeated
string is an error naming the lines, and nothing changes; `new_str` defaults to empty),
`insert` (`new_str` after line `insert_line`, 0 for the top) or `undo_edit` (the file's last
edit, also a creation). Paths are absolute. A file whose lines all end in CRLF keeps them
(the model's `\n` are written as `\r\n`); any other file is written as edited, byte for
byte. A file is read whole: one that is not a regular file (a device, a FIFO) or past 10 MB
is refused (the shell shows parts of it). An edit answers with the edited lines and a few
around them. Every file operation runs inside the sandbox session (tools/_editor_session.py),
never on the host; a refused call is an error the model reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from agentrl.sandbox.client import CALL_MARGIN_S
from agentrl.tool import Tool, ToolContext, ToolResult
from agentrl.tools.shell import in_session

_SOURCE = (Path(__file__).parent / "_editor_session.py").read_text()


class EditorTool(Tool):
    name = "str_replace_editor"
    description = (
        "View, create and edit files. view: show a file with line numbers (view_range "
        "[start, end], end -1 for the last line) or list a directory. create: write a new file. "
        "str_replace: replace old_str, which must occur exactly once, by new_str. insert: add "
        "new_str after line insert_line (0: at the top). undo_edit: revert the file's last edit. "
        "Paths must be absolute."
    )

    class Args(BaseModel):
        command: Literal["view", "create", "str_replace", "insert", "undo_edit"] = Field(
            description="The operation."
        )
        path: str = Field(description="Absolute path of the file or directory.")
        file_text: str | None = Field(None, description="create: the file's content.")
        old_str: str | None = Field(None, description="str_replace: the exact text to replace.")
        new_str: str | None = Field(None, description="str_replace / insert: the new text.")
        insert_line: int | None = Field(None, description="insert: the line to insert after.")
        view_range: list[int] | None = Field(None, description="view: [start, end] lines.")

    timeout_grace_s = CALL_MARGIN_S + 15.0

    def __init__(self, max_output_chars: int = 8000, timeout_s: float | None = None) -> None:
        self.max_output_chars = max_output_chars
        self.timeout_s = timeout_s

    async def __call__(self, args: EditorTool.Args, ctx: ToolContext) -> ToolResult:
        timeout = self.timeout_s if self.timeout_s is not None else ctx.timeout_s
        setup = f"{_SOURCE}\n_agentrl_editor = AgentrlEditor({self.max_output_chars!r})\n"
        call = f"_agentrl_editor.call({args.model_dump(exclude_none=True)!r})"
        got = await in_session(ctx, "the editor", "_agentrl_editor", setup, call, timeout)
        if isinstance(got, ToolResult):
            return got
        text, is_error = got
        return ToolResult(content=str(text), is_error=bool(is_error))

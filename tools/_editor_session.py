"""The file editor behind `str_replace_editor` (tools/editor.py), as it runs in the sandbox.

Not imported by agentrl: sent to the episode's sandbox session and run there (stdlib only), so
every file it reads or writes is the sandbox's, under the sandbox's user and limits. The undo
history lives in the session (one list of earlier contents per file).
"""

import os
import stat

SNIPPET = 4  # lines shown around an edit
MAX_BYTES = 10 << 20  # a file the editor reads whole, at most
SHOWN = 20  # lines listed for an old_str that occurs more than once


class AgentrlEditor:
    def __init__(self, cap):
        self.cap = cap
        self.history = {}
        self.crlf = {}  # path -> its lines end in \r\n (as last read)

    def call(self, a):
        """(answer, is_error) for one call; `a` holds the tool's arguments."""
        path = a.get("path") or ""
        if not path.startswith("/"):
            return (
                f"Error: the path {path!r} is not absolute; give the full path (starting with /)",
                True,
            )
        command = a.get("command")
        try:
            if command == "view":
                return self._cut(self.view(path, a.get("view_range"))), False
            if command == "create":
                return self.create(path, a.get("file_text"))
            if command == "str_replace":
                return self.replace(path, a.get("old_str"), a.get("new_str") or "")
            if command == "insert":
                return self.insert(path, a.get("insert_line"), a.get("new_str"))
            if command == "undo_edit":
                return self.undo(path)
        except (OSError, UnicodeError) as e:  # UnicodeEncodeError: a lone surrogate
            return f"Error: {type(e).__name__}: {e}", True
        return f"Error: unknown command {command!r}", True

    def _cut(self, text):
        if len(text) <= self.cap:
            return text
        half = self.cap // 2
        return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut; view a range ...]\n{text[-half:]}"

    def _read(self, path):
        """The file's text, its line ends as they are; a file whose every line ends in \\r\\n
        is read (and written back by `_write`) with \\n ends, as the model writes old_str."""
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # /dev/zero, a FIFO: no end, or no writer
            raise OSError(f"{path} is not a regular file; look at it with bash")
        if st.st_size > MAX_BYTES:
            raise OSError(
                f"{path} is {st.st_size} bytes, past the editor's {MAX_BYTES}: view a part "
                "with bash (head, sed -n '100,200p'), edit it with a script"
            )
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        self.crlf[path] = "\r\n" in text and text.count("\r\n") == text.count("\n")
        return text.replace("\r\n", "\n") if self.crlf[path] else text

    def _write(self, path, text):
        if self.crlf.get(path):
            text = text.replace("\r\n", "\n").replace("\n", "\r\n")
        data = text.encode("utf-8")  # a lone surrogate raises here, before the file is emptied
        with open(path, "wb") as f:
            f.write(data)

    def view(self, path, rng):
        if os.path.isdir(path):
            lines = []
            base = path.rstrip("/") or "/"
            for root, dirs, files in os.walk(base):
                depth = root[len(base) :].count("/")
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and depth < 1)
                for name in sorted(dirs) + sorted(f for f in files if not f.startswith(".")):
                    lines.append(os.path.join(root, name))
            return f"Files and directories up to 2 levels deep in {base}:\n" + "\n".join(lines)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such file or directory: {path}")
        lines = self._read(path).splitlines()
        start, end = 1, len(lines)
        if rng is not None:
            if len(rng) != 2 or not all(isinstance(x, int) for x in rng):
                raise OSError("view_range must be two integers [start, end] (end -1: to the end)")
            start, end = rng[0], (len(lines) if rng[1] == -1 else rng[1])
            if not 1 <= start <= len(lines) or end < start or end > len(lines):
                raise OSError(f"view_range {rng} is outside the file's lines 1-{len(lines)}")
        return "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(start, end + 1))

    def _snippet(self, path, text, first, last):
        lines = text.splitlines()
        lo, hi = max(1, first - SNIPPET), min(len(lines), last + SNIPPET)
        body = "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(lo, hi + 1))
        return self._cut(f"{path} lines {lo}-{hi} after the edit:\n{body}")

    def create(self, path, text):
        if text is None:
            return "Error: create needs file_text", True
        if os.path.exists(path):
            return f"Error: {path} already exists; edit it with str_replace or insert", True
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self.crlf.pop(path, None)  # written as given
        self._write(path, text)
        self.history.setdefault(path, []).append(None)
        return f"Created {path} ({len(text.splitlines())} lines)", False

    def replace(self, path, old, new):
        if old is None or old == "":
            return "Error: str_replace needs a non-empty old_str", True
        text = self._read(path)
        count = text.count(old)
        if count == 0:
            return (
                f"Error: old_str was not found in {path}; nothing was replaced (it must match exactly, whitespace included)",
                True,
            )
        if count > 1:
            return (
                f"Error: old_str occurs {count} times in {path} (lines {_lines_of(text, old)}); "
                "nothing was replaced: include more context so it is unique",
                True,
            )
        first = text.count("\n", 0, text.index(old)) + 1
        updated = text.replace(old, new, 1)
        self._write(path, updated)
        self.history.setdefault(path, []).append(text)
        return self._snippet(path, updated, first, first + new.count("\n")), False

    def insert(self, path, line, new):
        if new is None or not isinstance(line, int):
            return "Error: insert needs insert_line (an integer) and new_str", True
        text = self._read(path)
        lines = text.splitlines(True)
        if not 0 <= line <= len(lines):
            return (
                f"Error: insert_line {line} is outside 0-{len(lines)} (0 inserts at the top)",
                True,
            )
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        block = new if new.endswith("\n") else new + "\n"
        updated = "".join(lines[:line]) + block + "".join(lines[line:])
        self._write(path, updated)
        self.history.setdefault(path, []).append(text)
        return self._snippet(path, updated, line + 1, line + block.count("\n")), False

    def undo(self, path):
        past = self.history.get(path)
        if not past:
            return f"Error: no edit of {path} to undo", True
        before = past.pop()
        if before is None:
            os.remove(path)
            return f"Undid the creation of {path} (removed)", False
        self._write(path, before)
        return f"Undid the last edit of {path}", False


def _lines_of(text, old, most=SHOWN):
    """The lines where the first `most` matches of `old` start, read in one pass (a count per
    match from the top took minutes for a one-character old_str in a large file)."""
    lines, at, line, counted = [], text.find(old), 1, 0
    while at >= 0 and len(lines) < most:
        line += text.count("\n", counted, at)
        counted = at
        lines.append(line)
        at = text.find(old, at + 1)
    return "[" + ", ".join(map(str, lines)) + (", ...]" if at >= 0 else "]")

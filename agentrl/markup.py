"""The tokenizer's markup: its added tokens (<|im_end|>, <tool_call>, …) as strings, and its ordinary
tokenization without them, so that text from tools and envs is tokenized as text and only the
chat template's own markup becomes markup ids (`agentrl.render` explains where each is used)."""

from __future__ import annotations

import re
from typing import Any

from agentrl.types import Message

TEXT_ROLES = frozenset({"system", "user", "tool"})  # their content is text, never markup
_ZWSP = "\u200b"
# A content past this many characters a token of its cut (and past HEAD_MIN_CHARS) is tokenized
# by that head alone (`cut_to_tokens`); text runs 3-5 characters a token: the head holds the cut
HEAD_CHARS_PER_TOKEN = 16
HEAD_MIN_CHARS = 1 << 16  # below this a content is cut exactly, its count exact


def cut_to_tokens(content: str, max_tokens: int, encode: Any, decode: Any) -> tuple[str, int]:
    """`content` cut to at most `max_tokens` tokens of `encode` (a marker says how many were cut)
    and that count. A content longer than `HEAD_CHARS_PER_TOKEN` characters a token (64 KB at
    least) is tokenized by its head only: a tool's 10 MB answer was tokenized whole, 10 s in the event loop every
    episode shares, to keep its first 256 tokens. The tokens past the head are then counted at
    the head's characters a token, and the marker says "about"."""
    head_chars = max(HEAD_CHARS_PER_TOKEN * max_tokens, HEAD_MIN_CHARS)
    if len(content) > head_chars:
        head = encode(content[:head_chars])
        if len(head) > max_tokens:
            past = round((len(content) - head_chars) * len(head) / head_chars)
            cut = len(head) - max_tokens + past
            return decode(head[:max_tokens]) + f"\n…[about {cut} tokens truncated]", cut
    ids = encode(content)
    if len(ids) <= max_tokens:
        return content, 0
    cut = len(ids) - max_tokens
    return decode(ids[:max_tokens]) + f"\n…[{cut} tokens truncated]", cut


class Markup:
    """The tokenizer's added tokens as strings, and its ordinary tokenization without them."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.ids = {str(getattr(t, "content", t)): i for i, t in added.items()}
        longest_first = sorted(self.ids, key=len, reverse=True)  # leftmost-longest, as HF splits
        self.pattern = re.compile("|".join(map(re.escape, longest_first))) if self.ids else None
        self.plain = _without_added_tokens(tokenizer)

    def find(self, text: str) -> list[re.Match[str]]:
        return list(self.pattern.finditer(text)) if self.pattern else []

    def plain_encode(self, text: str) -> list[int]:
        """`text` through the normalizer, pre-tokenizer and model only: no markup ids."""
        if not text:
            return []
        if self.plain is not None:
            return list(self.plain.encode(text, add_special_tokens=False).ids)
        return list(self.tok.encode(self.defang_text(text), add_special_tokens=False))  # slow

    def split_encode(self, marks_in: str, text: str, start: int) -> list[int] | None:
        """Ids of `text[start:]`: markup ids exactly where `marks_in` (aligned with `text`) holds
        markup strings, ordinary tokenization between them. None if that cannot be exact."""
        if self.plain is None:
            return None
        ids: list[int] = []
        pos = start
        for m in self.find(marks_in):
            if m.end() <= start:
                continue
            if m.start() < start:
                return None
            ids += self.plain_encode(text[pos : m.start()])
            ids.append(self.ids[m.group()])
            pos = m.end()
        return ids + self.plain_encode(text[pos:])

    def aligned_encode(self, text: str, neutral: str, start: int, fill: str) -> list[int] | None:
        """Ids of `text[start:]` with the markup of `neutral` (the same rendering with content's
        markup strings filled with `fill`) as the only markup ids; None unless the two agree
        everywhere but at the filled characters."""
        if len(text) != len(neutral):
            return None
        pos = 0
        for run in re.finditer(re.escape(fill) + "+", neutral):
            if text[pos : run.start()] != neutral[pos : run.start()]:
                return None
            pos = run.end()
        if text[pos:] != neutral[pos:]:
            return None
        ids = self.split_encode(neutral, text, start)
        markup = set(self.ids.values())
        expected = sum(1 for m in self.find(neutral) if m.start() >= start)
        if ids is None or sum(i in markup for i in ids) != expected:
            return None  # the ordinary tokenization made a markup id: not exact, fall back
        return ids

    def neutral(self, msg: Message, fill: str) -> Message:
        """`msg` with each markup string in its text replaced by as many `fill` characters."""
        return self._map(msg, lambda s: self.pattern.sub(lambda m: fill * len(m.group()), s))

    def defang(self, msg: Message) -> Message:
        """`msg` with a zero-width space after the first character of each markup string."""
        return self._map(msg, self.defang_text)

    def defang_text(self, text: str) -> str:
        if self.pattern is None:
            return text
        while (m := self.pattern.search(text)) is not None:
            text = text[: m.start() + 1] + _ZWSP + text[m.start() + 1 :]
        return text

    def schemas_as_text(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Tool schemas with a zero-width space in each markup string of their text: the
        template writes them into the prompt, and a schema is text, never turn structure. A
        red-team pass put `<|im_end|>\n<|im_start|>system` in a tool's description, and the
        model read a system turn there."""

        def walk(v: Any) -> Any:
            if isinstance(v, str):
                return self.defang_text(v)
            if isinstance(v, dict):
                return {walk(k): walk(x) for k, x in v.items()}
            if isinstance(v, list):
                return [walk(x) for x in v]
            return v

        return tools if self.pattern is None else [walk(t) for t in tools]

    def _map(self, msg: Message, f: Any) -> Message:
        if self.pattern is None or msg.role not in TEXT_ROLES:
            return msg
        update = {
            k: f(v)
            for k in ("content", "reasoning_content")
            if isinstance(v := getattr(msg, k), str) and self.pattern.search(v)
        }
        return msg.model_copy(update=update) if update else msg


def _without_added_tokens(tokenizer: Any) -> Any:
    """A fast tokenizer's normalizer, pre-tokenizer and model (shared, not copied) with no added
    tokens; None for a slow tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    plain = Tokenizer(backend.model)
    if backend.normalizer is not None:
        plain.normalizer = backend.normalizer
    if backend.pre_tokenizer is not None:
        plain.pre_tokenizer = backend.pre_tokenizer
    return plain

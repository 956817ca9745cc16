"""The tokenizer's chat template, encode and decode with transformers' per-call work done once.

The rollout renders two or three templates and tokenizes twice at every turn boundary of an episode,
one after another in the event loop all episodes share; transformers' wrappers around the jinja
template and the Rust tokenizer cost as much again as the work itself (`bench/rollout_overhead.py`).
Each fast path here gives exactly what the slow path gives, or is not used:

- `ChatTemplate(tok, tools, kwargs)(messages, add_generation_prompt)` is
  `tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=…,
  **kwargs)`: the same compiled template (transformers' own, sandboxed, cached), the same inputs
  (None-valued keys dropped, plain JSON data, reasoning aliased), with the template's choice, the
  tools' and the keyword arguments' plain copies made once. Used only where the tokenizer is a
  transformers tokenizer whose `apply_chat_template` is transformers' own, and probe
  conversations render the same both ways; else every call goes through `apply_chat_template`.
- `Codec(tok).encode(text)` is `tok.encode(text, add_special_tokens=False)` and `.decode(ids)`
  `tok.decode(ids, skip_special_tokens=False)`, straight to the Rust backend, for a fast tokenizer
  whose `encode`/`decode` are transformers' own (no subclass override), with no truncation or
  padding set on the backend and the tokenizer's own `split_special_tokens` (checked every call:
  transformers sets them per call), and (decode) no clean-up of spaces.
- `content_prefix(b1, full, content, sentinel)` is the common prefix of the observation delta's
  two sentinel renderings (agentrl/render.py, B1 and B2) from B1 alone, where A (the turns with
  the message's own content) shows where B2 parts from B1; else None, and B2 is rendered.

`tests/unit/test_fastpath.py` renders and tokenizes random multi-turn conversations of every
template family both ways and asserts the same text and ids.
"""

from __future__ import annotations

import functools
import inspect
import logging
from types import SimpleNamespace
from typing import Any

log = logging.getLogger(__name__)

_JSON_SCALARS = (str, int, float, bool)


@functools.cache
def _hf() -> Any:
    """transformers' own steps (private names: so the direct path cannot drift from them), or
    None (another transformers: the wrappers, always). Imported when a tokenizer is wrapped."""
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
        from transformers.utils import chat_template_utils as ctu
    except ImportError:  # pragma: no cover
        return None
    if not all(hasattr(ctu, n) for n in ("_compile_jinja_template", "render_jinja_template")):
        return None  # pragma: no cover
    # transformers from 5.2x hands the template plain copies of the data with reasoning
    # aliased; before (5.12, SGLang 0.5.17's pin on GPU hosts) the data as given: the same steps
    plain = getattr(ctu, "_plain_template_data", None)
    alias = getattr(ctu, "_alias_reasoning_fields", None)
    steps = (plain, alias) if plain is not None and alias is not None else None
    return SimpleNamespace(base=PreTrainedTokenizerBase, backend=TokenizersBackend, ctu=ctu,
                           steps=steps)  # fmt: skip


class ChatTemplate:
    """`tok.apply_chat_template(…, tokenize=False)` with fixed tools and keyword arguments."""

    def __init__(
        self,
        tok: Any,
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        fast: bool = True,
    ) -> None:
        """`fast=False`: every call through `apply_chat_template` (the reference path)."""
        self.tok, self.tools, self.kwargs = tok, tools, kwargs
        self._compiled: Any = None
        self._steps: Any = None  # its plain-data and reasoning-alias steps, where it has them
        self._plain_tools: Any = None
        self._plain_kwargs: dict[str, Any] = {}
        self._globals: dict[str, Any] = {}
        try:
            if fast:
                self._prepare()
        except Exception as e:  # noqa: BLE001 - no template, an unknown tokenizer: the wrapper
            log.debug("chat template fast path off (%s: %s)", type(e).__name__, e)
            self._compiled = None

    @property
    def direct(self) -> bool:
        """Whether calls skip `apply_chat_template` (for tests and benchmarks)."""
        return self._compiled is not None

    def _prepare(self) -> None:
        tok, hf = self.tok, _hf()
        if hf is None or not isinstance(tok, hf.base):
            return
        own, ctu = hf.base.apply_chat_template, hf.ctu
        if getattr(type(tok), "apply_chat_template", None) is not own:
            return
        wrappers = (own, ctu.render_jinja_template)
        taken = {"messages", *(p for f in wrappers for p in inspect.signature(f).parameters)}
        if set(self.kwargs) & taken:  # a keyword the wrappers take for themselves
            return
        template = tok.get_chat_template(None, self.tools)
        compiled = ctu._compile_jinja_template(template)
        if compiled.environment.is_async:
            return
        if hf.steps is None and not all(isinstance(t, dict) for t in self.tools or ()):
            return  # 5.12 turns a callable tool into its schema per call
        self._steps = hf.steps
        plain = hf.steps[0] if hf.steps else _same
        self._plain_tools = plain(self.tools)
        self._plain_kwargs = plain({**tok.special_tokens_map, **self.kwargs})
        self._compiled = compiled
        self._globals = dict(compiled.globals)  # jinja's Template.new_context: per call
        if not all(self._agrees(probe, gen) for probe in _probes() for gen in (False, True)):
            log.debug("chat template fast path off: a probe renders otherwise")
            self._compiled = None

    def _agrees(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> bool:
        try:
            want = self._wrapped(messages, add_generation_prompt)
        except Exception:  # noqa: BLE001 - the template refuses the probe: nothing to compare
            return True
        try:
            return self._direct(messages, add_generation_prompt) == want
        except Exception as e:  # noqa: BLE001 - off, said in _prepare's log line with its cause
            log.debug("chat template fast path: a probe raised %s: %s", type(e).__name__, e)
            return False

    def __call__(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        if self._compiled is None:
            return self._wrapped(messages, add_generation_prompt)
        return self._direct(messages, add_generation_prompt)

    def _wrapped(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(
            messages,
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.kwargs,
        )

    def _direct(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        if not messages:
            raise ValueError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        t = self._compiled
        if self._steps is None:  # transformers 5.12: the messages as they are
            chat = messages
        else:
            plain, alias = self._steps
            chat = alias([_plain_message(m, plain) for m in messages])
        # jinja's Template.render(messages=…, tools=…, documents=…, add_generation_prompt=…,
        # **kwargs), its globals (a ChainMap it flattens every call) flattened once
        context = {**self._globals, "messages": chat, "tools": self._plain_tools,
                   "documents": None, "add_generation_prompt": add_generation_prompt,
                   **self._plain_kwargs}  # fmt: skip
        env = t.environment
        ctx = env.context_class(env, context, t.name, t.blocks, globals=self._globals)
        try:
            return env.concat(t.root_render_func(ctx))
        except Exception:
            env.handle_exception()  # raises, as Template.render does


def _same(x: Any) -> Any:
    return x


def _plain_message(msg: dict[str, Any], plain: Any) -> dict[str, Any]:
    """transformers' `_plain_template_data` of a message with its None-valued keys dropped; a
    value of an exact JSON scalar type is its own plain copy (the common case, skipped)."""
    return {
        plain(k): v if type(v) in _JSON_SCALARS else plain(v)
        for k, v in msg.items()
        if v is not None
    }


def _probes() -> list[list[dict[str, Any]]]:
    """Conversations in every shape the renderer writes: tools called, results, reasoning."""
    call = {"id": "call_0", "type": "function",
            "function": {"name": "probe_tool", "arguments": {"probe": "x", "n": [1, None]}}}  # fmt: skip
    user, system = {"role": "user", "content": "x"}, {"role": "system", "content": "s"}
    asked = {"role": "assistant", "content": "", "tool_calls": [call]}
    thought = {**asked, "reasoning_content": "r", "thinking": "r"}
    tool = {"role": "tool", "content": "42", "tool_call_id": "call_0", "name": "probe_tool"}
    answer = {"role": "assistant", "content": "y"}
    return [[user], [system, user, asked, tool], [user, thought, tool, tool, answer, user],
            [user, answer]]  # fmt: skip


class Codec:
    """`tok.encode(text, add_special_tokens=False)` and `tok.decode(ids)`, through the Rust
    backend where that is provably the same (see the module docstring)."""

    def __init__(self, tok: Any, fast: bool = True) -> None:
        """`fast=False`: every call through the tokenizer's own methods (the reference path)."""
        self.tok = tok
        enc = _backend(tok, "encode", "_encode_plus", "_get_padding_truncation_strategies")
        self.backend = enc if fast else None
        self.split = bool(getattr(tok, "split_special_tokens", False))
        dec = _backend(tok, "decode", "_decode")
        clean = getattr(tok, "clean_up_tokenization_spaces", True)
        self.decoder = dec if fast and dec is not None and not clean else None

    def encode(self, text: str) -> list[int]:
        b = self.backend
        if (
            b is not None
            and b.truncation is None
            and b.padding is None
            and b.encode_special_tokens == self.split
        ):
            return b.encode(text, add_special_tokens=False).ids
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        if self.decoder is not None:
            return self.decoder.decode(ids, skip_special_tokens=False)
        return self.tok.decode(ids, skip_special_tokens=False)


def _backend(tok: Any, *methods: str) -> Any:
    """The Rust tokenizer of `tok` when its `methods` are transformers' own, else None."""
    hf = _hf()
    if hf is None or not isinstance(tok, hf.backend):
        return None
    for name in methods:
        own = getattr(hf.backend, name, None)
        if own is None or getattr(type(tok), name, None) is not own:
            return None
    return getattr(tok, "_tokenizer", None)


def common_prefix(a: str, b: str) -> str:
    """The longest common prefix, by halving on slice equality (compared in C): a rendered
    conversation is thousands of characters, and this runs for every turn's observation."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return a[:lo]


def content_prefix(b1: str, full: str, content: str, sentinel: str) -> str | None:
    """common_prefix(B1, B2) of the observation delta's renderings (agentrl/render.py) without
    B2, where B1 and A show where B2 parts from B1: B1 holds `sentinel` once; A (the same turns
    with the message's own `content`, which differs from `sentinel` at its first character)
    agrees with B1 up to there and holds `content` there. The template then writes the content
    as it is, after text that does not depend on it, and B2 (the other sentinel, which differs
    at its first character) parts from B1 right there. Else None: B2 must be rendered.
    `tests/unit/test_fastpath.py` compares both ways for every template family."""
    at = b1.find(sentinel)
    if at < 0 or b1.find(sentinel, at + 1) >= 0 or not content or content[0] == sentinel[0]:
        return None
    head = b1[:at]
    return head if full.startswith(head) and full.startswith(content, at) else None

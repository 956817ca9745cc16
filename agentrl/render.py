"""Messages ⇄ token ids with the model's chat template, token-in-token-out.

The first prompt is the chat template applied to the env's start messages (with the tools). After
that nothing is ever re-tokenized: each turn appends the engine's sampled ids unchanged, then the
ids of the new observation messages, computed as the template's *delta* after that turn:

    A  = render([user, ASSISTANT] + new,             add_generation_prompt=True)
    B1 = render([user, ASSISTANT] + [new[0] with content "⟦1"], …)      two sentinels: where B1
    B2 = render([user, ASSISTANT] + [new[0] with content "⟦2"], …)      and B2 part is new[0]'s text
    cut = end of the last end-of-turn marker in common_prefix(B1, B2)    (the assistant's turn end)
    delta(new) = A[cut:]          (the separator, the new messages, the next generation prompt)

ASSISTANT is the turn the model just produced (its parsed message, tool calls included), so the
template sees the history a real conversation has: templates that render the *last* assistant
message differently (Qwen3 adds an empty <think> block), or that refuse tool results not preceded
by a tool call (GPT-OSS), give the right delta. In A, B1 and B2 the assistant is never last, so it
renders the same in all three; `A[:cut] == B1[:cut]` is checked, and a template whose history
rendering depends on later messages in any other way is a RenderError (a configuration problem,
never an episode failure). The end-of-turn marker is the text of the token the engine stopped on
(<|im_end|>, <|eot_id|>, <|call|>, …), else the tokenizer's end of turn; when the sampled turn did
not end with it, it is supplied at the head of the delta, masked.

The delta is tokenized on its own, so tool output can never merge with the sampled tokens before
it, and templates that rewrite history (Qwen3 drops earlier <think> blocks) cannot change ids the
model already produced.
"""

from __future__ import annotations

from typing import Any

from agentrl.types import Message, ToolCall

_BASE = [Message(role="user", content="x"), Message(role="assistant", content="y")]
_USER = Message(role="user", content="x")
_SENTINELS = ("\u27e61", "\u27e72")  # differ at their first character


class RenderError(ValueError):
    pass


class Renderer:
    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        end_of_turn: str | None = None,
    ) -> None:
        self.tok = tokenizer
        self.tools = tools or None
        self.template_kwargs = template_kwargs or {}
        self.eot = end_of_turn or tokenizer.eos_token
        eot_ids = self.encode(self.eot)
        if len(eot_ids) != 1:
            raise RenderError(f"end-of-turn {self.eot!r} is not a single token in this tokenizer")
        self.eot_id = eot_ids[0]
        base = self.render(_BASE)
        if not base.rstrip().endswith(self.eot):
            raise RenderError(
                f"the chat template does not end an assistant turn with {self.eot!r}; "
                "set model.end_of_turn to the token it uses"
            )
        self._base_text = base
        self.separator = base[base.rindex(self.eot) + len(self.eot) :]

    # -- text ----------------------------------------------------------------------------------

    def render(self, messages: list[Message], add_generation_prompt: bool = False) -> str:
        return self.tok.apply_chat_template(
            [m.to_template() for m in messages],
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        # lone surrogates (a tool may return anything) cannot be tokenized: replace them
        text = text.encode("utf-8", "replace").decode("utf-8")
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    # -- ids -----------------------------------------------------------------------------------

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Ids of the first prompt, ending with the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def delta_text(self, new: list[Message], assistant: Message | None = None) -> str:
        """The text the template puts after an assistant turn's end-of-turn marker and its
        separator, for the messages `new`, up to and including the next generation prompt."""
        text = self.after_turn(new, assistant, self.eot)
        return text[len(self.separator) :] if text.startswith(self.separator) else text

    def after_turn(self, new: list[Message], assistant: Message | None, marker: str) -> str:
        """Everything the template renders after `assistant`'s end marker `marker`: the
        separator, `new`, the generation prompt (see the module docstring)."""
        if not new:
            raise RenderError("an observation delta needs at least one new message")
        assistant = assistant or _default_assistant(new)
        base = [_USER, assistant]
        full = self.render(base + new, add_generation_prompt=True)
        b1, b2 = (
            self.render(base + [new[0].model_copy(update={"content": s})]) for s in _SENTINELS
        )
        common = _common_prefix(b1, b2)
        at = common.rfind(marker)
        if at < 0 or not full.startswith(b1[: at + len(marker)]):
            raise RenderError(
                f"cannot find where the assistant's turn ends (marker {marker!r}) in the chat "
                f"template's rendering of a {new[0].role!r} message after it, or the template "
                "renders earlier turns differently once messages follow them; the observation "
                "delta is undefined. Use a template whose history rendering is stable, or set "
                "the end-of-turn token the template uses"
            )
        return full[at + len(marker) :]

    def observation_ids(
        self, new: list[Message], sampled: list[int], assistant: Message | None = None
    ) -> list[int]:
        """Ids to append after the sampled ids `sampled` (the turn `assistant`, as parsed) so the
        model can read `new` and answer.

        The end-of-turn marker is the token the engine stopped on when the template ends turns
        with it, else the tokenizer's; if the sampled turn did not end with the marker (a model
        that stopped on another id, or a length cut), the marker is supplied here, masked.
        """
        last = self.decode(sampled[-1:]) if sampled else ""
        markers = [m for m in (last, self.eot) if m and m.strip()]
        error: RenderError | None = None
        for marker in dict.fromkeys(markers):
            try:
                text = self.after_turn(new, assistant, marker)
            except RenderError as e:
                error = error or e
                continue
            head = "" if marker == last else marker
            return self.encode(head + text)
        raise error or RenderError("the sampled turn has no end-of-turn marker to cut at")

    def assistant_text(self, sampled: list[int]) -> str:
        """The decoded turn without its final end-of-turn / stop token."""
        text = self.decode(sampled)
        for stop in (self.eot, self.tok.eos_token, self.tok.pad_token):
            if stop and text.endswith(stop):
                return text[: -len(stop)]
        return text

    def truncate(self, content: str, max_tokens: int) -> tuple[str, int]:
        """Cut `content` to at most `max_tokens` tokens (plus a marker); returns (text, tokens cut)."""
        ids = self.encode(content)
        if len(ids) <= max_tokens:
            return content, 0
        cut = len(ids) - max_tokens
        return self.decode(ids[:max_tokens]) + f"\n…[{cut} tokens truncated]", cut


def _common_prefix(a: str, b: str) -> str:
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    return a[:i]


def _default_assistant(new: list[Message]) -> Message:
    """An assistant turn that `new` can follow: one that called the tools answered in `new`
    (templates such as GPT-OSS refuse tool results after a turn without tool calls)."""
    calls = [
        ToolCall(id=m.tool_call_id or f"call_{i}", name=m.name or "tool", arguments={})
        for i, m in enumerate(new)
        if m.role == "tool"
    ]
    return Message(role="assistant", content="y", tool_calls=calls)

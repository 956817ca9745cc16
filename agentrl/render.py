"""Messages ⇄ token ids with the model's chat template, token-in-token-out.

The first prompt is the chat template applied to the env's start messages (with the tools). After
that nothing is ever re-tokenized: each turn appends the engine's sampled ids unchanged, then the
ids of the new observation messages computed as the template's *delta*:

    delta(new) = render(BASE + new, add_generation_prompt=True) − render(BASE)

where BASE is a fixed user/assistant exchange. The delta is tokenized on its own, so tool output
can never merge with the sampled tokens before it, and templates that rewrite history (Qwen3 drops
earlier <think> blocks) cannot change ids the model already produced. The template's separator
after the assistant's end-of-turn token (e.g. "\\n" after <|im_end|>) starts the delta.
"""

from __future__ import annotations

from typing import Any

from agentrl.types import Message

_BASE = [Message(role="user", content="x"), Message(role="assistant", content="y")]


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

    def delta_text(self, new: list[Message]) -> str:
        full = self.render(_BASE + new, add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise RenderError(
                "the chat template re-renders earlier turns when messages are appended, so an "
                "observation delta is undefined; use a template whose history rendering is stable"
            )
        return full[len(self._base_text) :]

    def observation_ids(self, new: list[Message], sampled: list[int]) -> list[int]:
        """Ids to append after the sampled ids `sampled` so the model can read `new` and answer.

        If the sampled turn did not end with the end-of-turn token (a model that stopped on
        another stop id), the end-of-turn token is supplied here, masked, to keep the format.
        """
        head = (
            self.separator if sampled and sampled[-1] == self.eot_id else self.eot + self.separator
        )
        return self.encode(head + self.delta_text(new))

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

"""Messages ⇄ token ids with the model's chat template, token-in-token-out.

The first prompt is the chat template applied to the env's start messages (with the tools). After
that nothing is ever re-tokenized: each turn appends the engine's sampled ids unchanged, then the
ids of the new observation messages, computed as the template's *delta* after that turn:

    A  = render([user, ASSISTANT] + new,             add_generation_prompt=True)
    B1 = render([user, ASSISTANT] + [new[0] with content "⟦1"], …)      two sentinels: where B1
    B2 = render([user, ASSISTANT] + [new[0] with content "⟦2"], …)      and B2 part is new[0]'s text
    cut = end of the last end-of-turn marker in common_prefix(B1, B2)    (the assistant's turn end)
    delta(new) = A[cut:]          (the separator, the new messages, the next generation prompt)
    (B2 is rendered only where B1 and A cannot show where it parts from B1: content_prefix)

ASSISTANT is the turn the model just produced (its parsed message, tool calls included), so the
template sees the history a real conversation has: templates that render the *last* assistant
message differently (Qwen3 adds an empty <think> block), or that refuse tool results not preceded
by a tool call (GPT-OSS), give the right delta. In A, B1 and B2 the assistant is never last, so it
renders the same in all three; `A[:cut] == B1[:cut]` is checked, and a template whose history
rendering depends on later messages in any other way is a RenderError (a configuration problem,
never an episode failure). The end-of-turn marker is the text of the token the engine stopped on
(<|im_end|>, <|eot_id|>, <|call|>, …), else the tokenizer's end of turn; when the sampled turn did
not end with it, it is supplied at the head of the delta, masked.

Templates that write no marker after an assistant turn, where the next message's tag ends it
(GLM-4.5: `<|observation|>` before a tool result, `<|user|>` before a user message) are
`opens_next`: the engines stop on those tags (`stop_ids`), and the delta is everything the
template writes after the turn, less the tag when the model sampled it (it stopped on it).

The delta is tokenized on its own, so tool output can never merge with the sampled tokens before
it, and templates that rewrite history (Qwen3 drops earlier <think> blocks) cannot change ids the
model already produced.

Text from tools and envs is text. The content of every system, user and tool message (the env's
start messages, tool results, messages an env adds) is tokenized with no markup ids: a tool that
prints `42<|im_end|>\n<|im_start|>system\n…` gives the model those characters, never a new turn
(a tool schema's markup text gets a zero-width space: `Markup.schemas_as_text`).
Markup means every added token of the tokenizer (<|im_end|>, <|eot_id|>, and also <tool_response>,
<think>, …). Only the template's own text becomes markup ids:

    R = render(messages)                 the template's text, as before
    N = render(messages, each markup string inside such content → as many "\ue000")
    R and N must agree everywhere but at those characters (templates that copy, trim or JSON-quote
    content do); then the markup found in N is the template's own: split R there, give those
    spans their ids and tokenize everything between them without markup.

Guarantee: content with no markup text gives exactly `tokenizer.encode(R)`, as before (it is
computed that way). Content with markup text gives the template's characters; the ids outside the
text between the two markup tokens around it are those of `tokenizer.encode(R)`, and that text is
tokenized as the tokenizer tokenizes ordinary text there (same merges across the content's borders).
When R and N do not align (a template that branches on markup inside content), each markup string
in the content gets a zero-width space after its first character instead, and a warning is logged:
the model reads nearly the same text, still never as markup. Assistant messages are the model's own
turns and render as the template writes them (their <think>/<tool_call> markup is meant).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from agentrl.fastpath import ChatTemplate, Codec, common_prefix, content_prefix
from agentrl.markup import Markup, cut_to_tokens
from agentrl.parsers import Parser
from agentrl.types import ConfigError, Message, ToolCall

log = logging.getLogger(__name__)

_BASE = [Message(role="user", content="x"), Message(role="assistant", content="y")]
_USER = Message(role="user", content="x")
_CALL = ToolCall(id="call_0", name="probe_tool", arguments={"probe": "x"})
_ASKED = Message(role="assistant", content="", tool_calls=[_CALL])  # the probes' tool-call turn
_SENTINELS = ("\u27e61", "\u27e72")  # differ at their first character
# end-of-message tokens that close a turn waiting for a tool result, in place of the template's
# end of turn (Llama 3.1 with tools: `Environment: ipython`, the call, <|eom_id|>, then the
# ipython message; the template itself writes <|eot_id|> there)
TOOL_WAIT_ENDS = ("<|eom_id|>",)


class RenderError(ValueError):
    pass


class Unrenderable(Exception):
    """The chat template refused a history holding a turn the model wrote: the model's doing
    (scored as a parse error), never an infrastructure abort that would take it out of its
    group's baseline (a red-team pass found that hiding place under rollout.thinking=template)."""


class Renderer:
    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        end_of_turn: str | None = None,
        fast: bool = True,  # False: the reference paths throughout (agentrl/fastpath.py)
    ) -> None:
        self.tok = tokenizer
        self.markup = Markup(tokenizer)
        self.tools = self.markup.schemas_as_text(tools) if tools else None
        if tools and self.tools != tools:  # an MCP server's or an agent framework's descriptions
            log.warning("a tool schema holds special-token text; a zero-width space keeps it text")
        self.template_kwargs = template_kwargs or {}
        self.fast = fast
        self.template = ChatTemplate(tokenizer, self.tools, self.template_kwargs, fast)
        self.codec = Codec(tokenizer, fast)
        self.eot = end_of_turn or tokenizer.eos_token
        eot_ids = self.encode(self.eot)
        if len(eot_ids) != 1:
            raise RenderError(
                f"the end of turn {self.eot!r} (rollout.end_of_turn, else the tokenizer's "
                f"eos_token) is not a single token of this tokenizer; "
                f"{_EOT_FIX.format(marker='<its turn-end token>')}"
            )
        self.eot_id = eot_ids[0]
        self._memo = functools.lru_cache(maxsize=64)(lambda text: tuple(self.encode(text)))
        self.explicit_eot = bool(end_of_turn)
        call_turn = self._probe_call()  # sets string_args
        base = self.render(_BASE)
        ends = base.rstrip().endswith(self.eot)
        # GLM-4.5's form: no marker after an assistant turn, the next message's role tag ends it
        # (<|user|>, <|observation|>), and the model stops on that tag
        self.opens_next = not ends and self._tag_after(_BASE, [_USER]) == self.eot
        if not ends and not self.opens_next:
            raise RenderError(_turn_end_advice(tokenizer, base, self.eot))
        self._base_text = base
        self.separator = "" if self.opens_next else base[base.rindex(self.eot) + len(self.eot) :]
        # the tags a turn ends on: the end of turn, and (opens_next) the tag of a tool message,
        # or the tag a tool-call turn ends with when it is not the end of turn (gpt-oss <|call|>)
        self.stop_tags = [self.eot, *self._tool_tag()]
        self.stop_tags += self._call_end(call_turn)
        # the tag the template closes an earlier answer with when it is not the end of turn the
        # model stopped on (gpt-oss: <|return|> sampled, <|end|> in history)
        self.history_end = self._history_end()
        self._warned = False  # the zero-width-space fallback was logged
        # the split encoding must be the tokenizer's own on markup-free content, else never used
        self._split_ok = self.markup.split_encode(_clean(base), base, 0) == self.encode(base)

    def _tool_tag(self) -> list[str]:
        """[the tag an `opens_next` template opens a tool message with], or []."""
        if not self.opens_next:
            return []
        answer = Message(role="tool", content="42", tool_call_id="call_0", name="probe_tool")
        try:
            tag = self._tag_after([_USER, _ASKED], [answer])
        except Exception as e:  # noqa: BLE001 - a template that renders no tool messages
            log.warning("the chat template renders no tool message after a call (%s): turns "
                        "stop on %r only", e, self.eot)  # fmt: skip
            return []
        return [tag] if tag is not None and tag != self.eot else []

    def _probe_call(self) -> str | None:
        """What the template writes for a tool-call turn after a user message's generation
        prompt. Sets `string_args` when the template concatenates a call's arguments as text
        (DeepSeek-V3's) and fails on the dict most templates `tojson`: calls then render with
        their JSON text. None, logged, when the template renders no tool-call turn (where tools
        are needed, the start-up round trip stops the run on it: check_round_trip)."""
        self.string_args = False
        try:
            written = self.render([_USER, _ASKED])
        except TypeError:
            self.string_args = True
            written = self.render([_USER, _ASKED])  # any other failure is the template's own
        except Exception as e:  # noqa: BLE001 - a template without tool calls
            log.debug("the chat template renders no tool-call turn (%s: %s)", type(e).__name__, e)
            return None
        try:
            return _continuation(self.render([_USER], add_generation_prompt=True), written)[1]
        except RenderError as e:
            log.debug("the chat template's tool-call turn does not follow its prompt (%s)", e)
            return None

    def _call_end(self, tail: str | None) -> list[str]:
        """[the markup a tool-call turn (`tail`, as `_probe_call` read it) ends with], when it is
        not the end of turn (gpt-oss's <|call|>; the engines stop on it), else []."""
        if self.opens_next or tail is None:  # opens_next: the next message's tag ends the turn
            return []  # (its own tags close the call: GLM's </tool_call>)
        ends = [t for t in self.markup.ids if tail.rstrip().endswith(t)]
        tag = max(ends, key=len) if ends else None
        closing = tag is not None and tag.startswith("</")  # a call's own closing tag
        return [tag] if tag and not closing and tag not in self.stop_tags else []

    def _history_end(self) -> str | None:
        """The markup an earlier answer ends with once a user message follows it, when that is
        not the end of turn (gpt-oss closes a sampled <|return|> with <|end|> in history)."""
        if self.opens_next:
            return None
        with_next = self.render([*_BASE, _USER])
        after = with_next[with_next.rfind(_BASE[-1].content) + len(_BASE[-1].content) :]
        tags = [t for t in self.markup.ids if after.startswith(t)]
        tag = max(tags, key=len) if tags else None
        return tag if tag and tag != self.eot else None

    def written_turn(self, history: list[Message], msg: Message, reasoning: str = "") -> str:
        """The text a model that follows its template samples for the assistant turn `msg` after
        `history`'s generation prompt, up to and including the tag it stops on. A prompt that
        opens a reasoning block the rendered turn lacks (DeepSeek's `<think>` prefill) gets
        `reasoning` and the block's close first. A template that renders `history` otherwise
        once `msg` follows (gpt-oss drops the analysis of earlier tool turns before an answer)
        gives the turn as it writes it after a lone user message."""
        prompt = self.render(history, add_generation_prompt=True)
        try:
            thinking, turn = _continuation(prompt, self.render([*history, msg]))
        except RenderError:
            alone = self.render([_USER], add_generation_prompt=True)
            thinking, turn = _continuation(alone, self.render([_USER, msg]))
        if thinking:
            turn = reasoning + (turn if turn.startswith("</think>") else "</think>" + turn)
        if self.opens_next:  # the turn ends with the tag of the message that follows
            return turn + (self.stop_tags[-1] if msg.tool_calls else self.eot)
        found = [(i, t) for t in self.stop_tags if (i := turn.find(t)) >= 0]
        if not found:
            return turn
        i, tag = min(found)
        return turn[: i + len(tag)]

    # -- text ----------------------------------------------------------------------------------

    def render(self, messages: list[Message], add_generation_prompt: bool = False) -> str:
        return self.template(
            [m.to_template(self.string_args) for m in messages], add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Ids of template text or sampled text: markup strings become their ids."""
        return self.codec.encode(_clean(text))

    def encode_text(self, text: str) -> list[int]:
        """Ids of `text` as text: markup strings in it are tokenized as ordinary characters."""
        return self.markup.plain_encode(_clean(text))

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids)

    def encoded(self, text: str) -> list[int]:
        """`encode(text)`, once while among the last 64 such texts: turn-end tags (supplied at
        many turns' end, every request's stop ids) and first prompts (a group's, the same)."""
        return list(self._memo(text))

    # -- ids -----------------------------------------------------------------------------------

    def prompt_ids(self, messages: list[Message], memo: bool = False) -> list[int]:
        """Ids of the first prompt, ending with the generation prompt; the content of system,
        user and tool messages is text (see the module docstring). `memo`: shared (`encoded`)."""
        full = self.render(messages, add_generation_prompt=True)
        return self._ids_after([], messages, full, 0, memo)

    def history_ids(self, messages: list[Message]) -> list[int]:
        """`prompt_ids` of a history that holds the model's turns: Unrenderable (the model's
        doing, a parse error) when the template refuses it."""
        try:
            return self.prompt_ids(messages)
        except Exception as e:  # jinja2's raise_exception, RenderError, TypeError, …
            raise Unrenderable(f"{type(e).__name__}: {e}") from e

    def delta_text(self, new: list[Message], assistant: Message | None = None) -> str:
        """The text the template puts after an assistant turn's end-of-turn marker and its
        separator, for the messages `new`, up to and including the next generation prompt."""
        text = self.after_turn(new, assistant, self.eot)
        return text[len(self.separator) :] if text.startswith(self.separator) else text

    def after_turn(self, new: list[Message], assistant: Message | None, marker: str) -> str:
        """Everything the template renders after `assistant`'s end marker `marker`: the
        separator, `new`, the generation prompt (see the module docstring)."""
        _, full, cut = self._cut(new, assistant, marker)
        return full[cut:]

    def _cut(
        self, new: list[Message], assistant: Message | None, marker: str, rendered: Any = None
    ) -> tuple[list[Message], str, int]:
        """(the messages before `new`, the rendering with `new`, where `new`'s text starts).
        `rendered`: `_sentinels(new, assistant)`, when made already (it holds no marker)."""
        base, full, b1, common = rendered or self._sentinels(new, assistant)
        at = common.rfind(marker)
        if at < 0 or not full.startswith(b1[: at + len(marker)]):
            raise RenderError(
                f"cannot find where the assistant's turn ends (marker {marker!r}) in the chat "
                f"template's rendering of a {new[0].role!r} message after it, or the template "
                "renders earlier turns differently once messages follow them; the observation "
                "delta is undefined. Use a template whose history rendering is stable, or set "
                "the end-of-turn token the template uses"
            )
        return base, full, at + len(marker)

    def _sentinels(
        self, new: list[Message], assistant: Message | None
    ) -> tuple[list[Message], str, str, str]:
        """(the messages before `new`, the rendering A with `new`, B1, the common prefix of B1
        and B2): the module docstring's three renderings, the same for every marker."""
        if not new:
            raise RenderError("an observation delta needs at least one new message")
        assistant = assistant or _default_assistant(new)
        base = [_USER, assistant]
        full = self.render(base + new, add_generation_prompt=True)
        b1 = self.render([*base, new[0].model_copy(update={"content": _SENTINELS[0]})])
        common = content_prefix(b1, full, new[0].content, _SENTINELS[0]) if self.fast else None
        if common is None:
            b2 = self.render([*base, new[0].model_copy(update={"content": _SENTINELS[1]})])
            common = common_prefix(b1, b2)
        return base, full, b1, common

    def _ids_after(
        self, before: list[Message], new: list[Message], full: str, cut: int, memo: bool = False
    ) -> list[int]:
        """Ids of `full[cut:]`, where `full` renders `before + new` with the generation prompt
        and `cut` lies before `new`; markup text inside `new`'s content stays text."""
        fill = _free_char(full)
        neutral = [self.markup.neutral(m, fill) for m in new]
        if all(a is b for a, b in zip(neutral, new, strict=True)):  # no markup text: as before
            return self.encoded(full[cut:]) if memo else self.encode(full[cut:])
        if self._split_ok:
            other = self.render(before + neutral, add_generation_prompt=True)
            ids = self.markup.aligned_encode(_clean(full), _clean(other), cut, fill)
            if ids is not None:
                return ids
        defanged = [self.markup.defang(m) for m in new]
        text = self.render(before + defanged, add_generation_prompt=True)
        if not text.startswith(full[:cut]):
            raise RenderError(
                "the chat template renders earlier turns differently when a message's content "
                "holds special-token text, so that text cannot be kept out of the prompt's "
                "structure; use a template that copies message content (model.tokenizer)"
            )
        if not self._warned:
            self._warned = True
            log.warning(
                "the chat template does not copy message content verbatim; special-token text "
                "in env/tool messages gets a zero-width space to keep it text (warned once)"
            )
        return self.encode(text[cut:])

    @property
    def stop_ids(self) -> list[int]:
        """Ids the engines must stop on besides the model's eos: every turn-end tag of a template
        whose next message's tag ends a turn (`opens_next`), or an end of turn given explicitly
        (`rollout.end_of_turn`); else none."""
        if not (self.opens_next or self.explicit_eot or len(self.stop_tags) > 1):
            return []
        return [self.encoded(t)[0] for t in self.stop_tags]

    def _tag_after(self, before: list[Message], after: list[Message]) -> str | None:
        """The markup token the template writes first after `before`'s last turn when `after`
        follows (None: the rendering of `before` is not a prefix, or no tag comes first)."""
        turn = self.render(before)
        full = self.render([*before, *after])
        if not full.startswith(turn):
            return None
        rest = full[len(turn) :]
        tags = [t for t in self.markup.ids if rest.startswith(t)]
        return max(tags, key=len) if tags else None

    def _opened_ids(
        self, new: list[Message], sampled: list[int], assistant: Message | None
    ) -> list[int]:
        """`observation_ids` of an `opens_next` template: everything the template writes after
        the assistant's turn, less the opening tag when the model already sampled that tag (it
        stopped on it); a turn that stopped elsewhere gets the tag supplied, masked."""
        before = [_USER, assistant or _default_assistant(new)]
        turn = self.render(before)
        full = self.render(before + new, add_generation_prompt=True)
        if not full.startswith(turn):
            raise RenderError(
                "the chat template renders the assistant's turn differently once messages follow "
                "it; the observation delta is undefined"
            )
        cut = len(turn)
        tag = next((t for t in self.stop_tags if full.startswith(t, cut)), None)
        if tag is not None and sampled and self.decode(sampled[-1:]) == tag:
            cut += len(tag)
        return self._ids_after(before, new, full, cut)

    def observation_ids(
        self, new: list[Message], sampled: list[int], assistant: Message | None = None
    ) -> list[int]:
        """Ids to append after the sampled ids `sampled` (the turn `assistant`, as parsed) so the
        model can read `new` and answer.

        The end-of-turn marker is the token the engine stopped on when the template ends turns
        with it, else the tokenizer's; if the sampled turn did not end with the marker (a model
        that stopped on another id, or a length cut), the marker is supplied here, masked. A
        turn that ended with an end-of-message token (`TOOL_WAIT_ENDS`) needs none: the tool
        result follows it, as the model card writes it.
        """
        if self.opens_next:
            return self._opened_ids(new, sampled, assistant)
        last = self.decode(sampled[-1:]) if sampled else ""
        ends = (*self.stop_tags, self.eot, self.history_end, self.tok.eos_token, *TOOL_WAIT_ENDS)
        if last not in ends:  # text (a stop string's last token, a length cut) ends no turn: as
            last = ""  # a marker it cut the delta at its last look-alike (a red-team pass)
        markers = [m for m in (last, self.eot, self.history_end) if m and m.strip()]
        error: RenderError | None = None
        rendered = None  # the renderings do not depend on the marker: made once
        for marker in dict.fromkeys(markers):
            try:
                rendered = rendered or self._sentinels(new, assistant)
                base, full, cut = self._cut(new, assistant, marker, rendered)
            except RenderError as e:
                error = error or e
                continue
            # the sampled stop closes the turn; also in place of the template's history form
            # of it (gpt-oss: the model's <|return|> stays where the template writes <|end|>)
            closed = marker == last or last in TOOL_WAIT_ENDS
            closed |= marker == self.history_end and last in self.stop_tags
            head = [] if closed else self.encoded(marker)  # the eot, one markup id
            return head + self._ids_after(base, new, full, cut)
        raise error or RenderError("the sampled turn has no end-of-turn marker to cut at")

    def assistant_text(self, sampled: list[int]) -> str:
        """The decoded turn without its final end-of-turn / stop token."""
        text = self.decode(sampled)
        for stop in (*self.stop_tags, self.tok.eos_token, self.tok.pad_token, *TOOL_WAIT_ENDS):
            if stop and text.endswith(stop):
                return text[: -len(stop)]
        return text

    def truncate(self, content: str, max_tokens: int) -> tuple[str, int]:
        """Cut `content` to at most `max_tokens` tokens (plus a marker); returns (text, tokens cut).
        A huge content is tokenized by its head alone (`markup.cut_to_tokens`)."""
        return cut_to_tokens(content, max_tokens, self.encode_text, self.decode)


def check_round_trip(renderer: Renderer, parser: Parser) -> None:
    """The start-up probe: one whole tool round trip with the configured template and parser —
    prompt → the assistant turn calling a tool, as the template writes it → parse → the tool
    result's delta → the next generation prompt. Any failure is a ConfigError naming the setting."""
    user = [Message(role="user", content="hi")]
    call, asked = _CALL, _ASKED
    where = f"rollout.parser={parser.name!r} with this model's chat template"
    try:
        turn = renderer.written_turn(user, asked)
        sampled = renderer.encode(turn)
        said = parser.parse(renderer.assistant_text(sampled))
        if [(c.name, c.arguments) for c in said.tool_calls] != [(call.name, call.arguments)]:
            raise RenderError(f"the parser read {said.tool_calls} from {turn[:160]!r}")
        parsed = Message(role="assistant", content=said.content, tool_calls=said.tool_calls)
        result = Message(role="tool", content="42", tool_call_id=said.tool_calls[0].id,
                         name="probe_tool")  # fmt: skip
        obs = renderer.decode(renderer.observation_ids([result], sampled, parsed))
    except (RenderError, ValueError, TypeError) as e:
        raise ConfigError(
            f"tool round trip failed for {where}: {e}. Set rollout.parser to the template's "
            "tool-call format, fix rollout.template_kwargs, or use a model whose chat template "
            "supports tool calls (model.path / model.tokenizer)"
        ) from e
    if "42" not in obs:
        raise ConfigError(f"tool round trip failed for {where}: the tool result is not in {obs!r}")


def _continuation(prompt: str, full: str) -> tuple[bool, str]:
    """(whether the prompt opened a reasoning block the rendering lacks, the assistant turn's
    text after the prompt) for `full`, a rendering that adds one assistant turn to `prompt`'s
    messages. DeepSeek's and thinking Qwen's prompts end with `<think>`, their renderings of the
    turn drop it with its reasoning; any other mismatch is a RenderError."""
    if full.startswith(prompt):
        return False, full[len(prompt) :]
    base = prompt.rstrip()
    if base.endswith("<think>") and full.startswith(base[: -len("<think>")]):
        return True, full[len(base) - len("<think>") :]
    raise RenderError("the template renders an assistant turn not after its own prompt")


def _default_assistant(new: list[Message]) -> Message:
    """An assistant turn that `new` can follow: one that called the tools answered in `new`
    (templates such as GPT-OSS refuse tool results after a turn without tool calls)."""
    calls = [
        ToolCall(id=m.tool_call_id or f"call_{i}", name=m.name or "tool", arguments={})
        for i, m in enumerate(new)
        if m.role == "tool"
    ]
    return Message(role="assistant", content="y", tool_calls=calls)


_EOT_FIX = "set rollout.end_of_turn={marker!r} (the engines then stop on it too)"


def _turn_end_advice(tokenizer: Any, base: str, eot: str) -> str:
    """The RenderError of a template whose assistant turn does not end with `eot`: names the
    marker it does end with (the first added token after the turn's text), and the fix."""
    after = base[base.rfind(_BASE[-1].content) + 1 :]
    found = [(after.find(t), t) for t in tokenizer.get_added_vocab() if t and t in after]
    marker = min(found)[1] if found else None
    ends = f" (it ends one with {marker!r})" if marker else ""
    return (
        f"the chat template does not end an assistant turn with {eot!r} (rollout.end_of_turn, "
        f"else the tokenizer's eos_token){ends}; "
        + _EOT_FIX.format(marker=marker or "<its turn-end token>")
    )


def _clean(text: str) -> str:
    """Lone surrogates (a tool may return anything) cannot be tokenized: replaced, 1 char each."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _free_char(text: str) -> str:
    """A private-use character that `text` does not contain."""
    return next(c for c in map(chr, range(0xE000, 0xF900)) if c not in text)

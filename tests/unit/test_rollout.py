"""The rollout loop against a scripted engine (a fake that samples text we choose) and real tools."""

import asyncio
import json
import socket

import pytest
from pydantic import BaseModel

from agentrl.engine import PromptTooLong
from agentrl.env import StepResult, ToolEnv, read_reward
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.metrics import rollout_metrics
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.sandbox.base import SandboxUnavailable
from agentrl.tool import Tool, ToolResult
from agentrl.types import Completion, FinishReason, Message, StopReason, Task


class ScriptedEngine:
    """Samples `script(prompt_text, turn)` + <|im_end|>, tokenized, with logprob -0.5 per token."""

    def __init__(self, tokenizer, script):
        self.tok, self.script = tokenizer, script
        self.inflight = self.max_inflight = self.calls = 0

    async def generate(self, input_ids, params, key=None):
        self.calls += 1
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        await asyncio.sleep(0.01)
        self.inflight -= 1
        prompt = self.tok.decode(input_ids)
        turn = prompt.count("<|im_start|>assistant") - 1
        ids = self.tok.encode(self.script(prompt, turn), add_special_tokens=False) + [151645]
        finish = FinishReason.STOP
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], FinishReason.LENGTH
        return Completion(ids, [-0.5] * len(ids), finish, weight_version="7")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends


def call(name="python", **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def solver(prompt, turn):
    if turn == 0:
        return "I'll compute it.\n" + call(code="print(874 - 404 * 99)")
    return "<answer>" + prompt.split("<tool_response>\n")[-1].split("\n")[0] + "</answer>"


TASK = Task(id="t0", data={"prompt": "Compute 874 - 404 * 99.", "answer": "-39122"})


def make(tok, script, env=CodeExecEnv, env_kwargs=None, **cfg):
    return Rollout(ScriptedEngine(tok, script), tok, env, RolloutConfig(**cfg), env_kwargs)


async def test_multi_turn_episode_is_token_exact(qwen_tokenizer):
    ro = make(qwen_tokenizer, solver)
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.COMPLETED and traj.error is None
    assert traj.reward == 1.0 and traj.reward_components["format"] == 1.0
    assert len(traj.turns) == 2 and traj.num_tool_calls == 1
    t0, t1 = traj.turns
    assert traj.turns[0].observations[0].content == "-39122"
    # sampled ids sit at the turn spans with their logprobs; the rest is masked
    for t in traj.turns:
        assert traj.loss_mask[t.start : t.end] == [1] * (t.end - t.start)
        assert traj.logprobs[t.start : t.end] == [-0.5] * (t.end - t.start)
        assert traj.token_ids[t.end - 1] == 151645 and t.weight_version == "7"
    assert sum(traj.loss_mask) == (t0.end - t0.start) + (t1.end - t1.start)
    obs = traj.token_ids[t0.end : t0.obs_end]
    assert ro.renderer.decode(obs).startswith("\n<|im_start|>user\n<tool_response>\n-39122")
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    json.loads(traj.to_json())


async def test_group_runs_concurrently(qwen_tokenizer):
    ro = make(qwen_tokenizer, solver, group_size=4)
    trajs = await ro.run_group(TASK)
    assert [t.sample_index for t in trajs] == [0, 1, 2, 3]
    assert ro.engine.max_inflight == 4
    assert len({t.metadata["session"] for t in trajs}) == 4


async def test_max_turns(qwen_tokenizer):
    ro = make(qwen_tokenizer, lambda p, t: call(code="print(1)"), max_turns=3)
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.MAX_TURNS and len(traj.turns) == 3
    last = traj.turns[-1]
    assert last.obs_end == last.end == len(traj.token_ids)  # no observation after the last turn
    assert traj.reward == 0.0


async def test_length_and_truncated_call(qwen_tokenizer):
    ro = make(qwen_tokenizer, lambda p, t: call(code="x = 1\n" * 100), max_new_tokens=20)
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.LENGTH
    assert traj.turns[0].num_parse_errors == 1 and traj.turns[0].end - traj.turns[0].start == 20


async def test_context_overflow_is_a_stop_not_an_error(qwen_tokenizer):
    ro = make(qwen_tokenizer, lambda p, t: call(code="print('y' * 300)"), max_context_tokens=260,
              max_obs_tokens=200)  # fmt: skip
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.CONTEXT_OVERFLOW and traj.error is None
    assert len(traj.token_ids) <= 260


async def test_a_first_prompt_past_the_context_is_an_overflow_that_says_so(qwen_tokenizer):
    """An audit: a task whose prompt alone fills rollout.max_context_tokens ended every episode
    at once as a silent context_overflow; the error names the task and both lengths."""
    ro = make(qwen_tokenizer, solver, max_context_tokens=40, group_size=2)
    trajs = await ro.run_group(TASK)
    assert ro.engine.calls == 0
    for traj in trajs:
        assert traj.stop_reason is StopReason.CONTEXT_OVERFLOW and traj.turns == []
        assert traj.error == (
            f"task 't0': its first prompt is {traj.prompt_len} tokens, "
            "rollout.max_context_tokens=40"
        )
    assert trajs[0].prompt_len >= 40

    class Short(ScriptedEngine):  # a server whose context is shorter than the rollout's
        async def generate(self, input_ids, params, key=None):
            raise PromptTooLong("http://e/generate: HTTP 400: longer than the context length")

    ro = Rollout(Short(qwen_tokenizer, solver), qwen_tokenizer, CodeExecEnv, RolloutConfig())
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.CONTEXT_OVERFLOW and traj.error == (
        "task 't0': the server refused its first prompt: http://e/generate: HTTP 400: longer "
        "than the context length"
    )


async def test_parse_errors_become_observations_then_a_stop(qwen_tokenizer):
    ro = make(qwen_tokenizer, lambda p, t: "<tool_call>{not json}</tool_call>")
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.PARSE_ERROR and len(traj.turns) == 2
    assert traj.turns[0].observations[0].content.startswith("Error: tool call is not valid JSON")


async def test_unknown_tool_and_bad_args_are_readable_errors(qwen_tokenizer):
    def script(p, t):
        return [call(name="shell", cmd="ls"), call(code=5), "<answer>-39122</answer>"][t]

    traj = await make(qwen_tokenizer, script).run_episode(TASK)  # max_parse_errors=2: no stop
    assert traj.stop_reason is StopReason.COMPLETED and traj.reward == 1.0
    # well-formed calls the tool refuses: tool errors the model reads, not parse errors
    assert traj.turns[0].num_parse_errors == traj.turns[1].num_parse_errors == 0
    assert traj.turns[0].num_tool_errors == traj.turns[1].num_tool_errors == 1
    assert "unknown tool 'shell'" in traj.turns[0].observations[0].content
    assert "invalid arguments for 'python'" in traj.turns[1].observations[0].content


class Flaky(Tool):
    name, description = "flaky", "fails in interesting ways"

    class Args(BaseModel):
        mode: str

    running = peak = 0

    async def __call__(self, args, ctx):
        Flaky.running += 1
        Flaky.peak = max(Flaky.peak, Flaky.running)
        try:
            await asyncio.sleep(0.05)
            if args.mode == "raise":
                raise RuntimeError("boom")
            if args.mode == "sleep":
                await asyncio.sleep(10)
            if args.mode == "down":
                raise SandboxUnavailable("sandbox at 127.0.0.1:1 refused")
            if args.mode == "long":
                return ToolResult(content="word " * 500)
            return ToolResult(content="ok")
        finally:
            Flaky.running -= 1


class FlakyEnv(ToolEnv):
    tools = [Flaky()]
    max_tool_errors = 2

    async def reward(self, trajectory):
        return 1.0


def flaky(*modes):
    def script(p, t):
        if t >= len(modes[0]):
            return "done"
        return "".join(call(name="flaky", mode=m[t]) for m in modes)

    return script


async def test_tool_calls_of_one_turn_run_concurrently(qwen_tokenizer):
    Flaky.peak = 0
    traj = await make(qwen_tokenizer, flaky(["ok"], ["ok"], ["ok"]), FlakyEnv).run_episode(TASK)
    assert traj.stop_reason is StopReason.COMPLETED and Flaky.peak == 3
    assert traj.turns[0].num_tool_calls == 3


async def test_tool_exception_and_timeout_are_observations(qwen_tokenizer):
    ro = make(qwen_tokenizer, flaky(["raise", "ok"], ["sleep", "ok"]), FlakyEnv, tool_timeout_s=0.3)
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.COMPLETED
    contents = [m.content for m in traj.turns[0].observations]
    assert "RuntimeError: boom" in contents[0] and "timed out after 0.3s" in contents[1]
    t0 = traj.turns[0]  # the exception is the tool's fault, the timeout the model's
    assert (t0.num_tool_errors, t0.num_tool_exceptions) == (1, 1)
    assert t0.num_tool_calls == 0 and traj.turns[1].num_tool_calls == 2  # failed calls: none
    assert [o.status for o in t0.tool_outcomes] == ["exception", "error"]
    assert traj.turns[1].num_tool_errors == 0 and traj.num_tool_attempts == 4
    assert rollout_metrics([traj])["rollout/tool_exceptions"] == 1.0


async def test_repeated_tool_errors_stop_the_episode(qwen_tokenizer):
    ro = make(qwen_tokenizer, flaky(["sleep"] * 5), FlakyEnv, tool_timeout_s=0.05)
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.TOOL_ERROR and len(traj.turns) == 2
    # a tool that raises every time is broken, not the policy: no tool_error stop
    traj = await make(qwen_tokenizer, flaky(["raise"] * 5), FlakyEnv).run_episode(TASK)
    assert traj.stop_reason is StopReason.COMPLETED
    assert sum(t.num_tool_exceptions for t in traj.turns) == 5


async def test_tool_output_is_truncated_in_tokens(qwen_tokenizer):
    ro = make(qwen_tokenizer, flaky(["long"]), FlakyEnv, max_obs_tokens=32)
    traj = await ro.run_episode(TASK)
    t = traj.turns[0]
    assert t.truncated_obs_tokens == 500 - 32 + 1 or t.truncated_obs_tokens > 400
    assert "tokens truncated]" in t.observations[0].content


def test_a_huge_tool_output_is_cut_from_its_head_alone(qwen_tokenizer):
    """A tool's 10 MB answer was tokenized whole (10 s in the event loop every episode shares) to
    keep its first max_obs_tokens; a content past 16 characters a token of the cut (64 KB at
    least) is now tokenized by that head, and the tokens past it are estimated ("about"). Short contents are
    cut exactly, as before."""
    from agentrl.markup import HEAD_CHARS_PER_TOKEN, HEAD_MIN_CHARS
    from agentrl.render import Renderer

    r = Renderer(qwen_tokenizer)
    seen: list[int] = []
    encode = r.encode_text
    r.encode_text = lambda text: seen.append(len(text)) or encode(text)  # type: ignore[method-assign]
    content = "".join(f"line {i % 997:03d}: value={i * 7 % 10007:05d}\n" for i in range(20_000))
    text, cut = r.truncate(content, 256)
    assert seen == [max(HEAD_CHARS_PER_TOKEN * 256, HEAD_MIN_CHARS)]  # the head only, once
    exact = len(encode(content)) - 256
    assert abs(cut - exact) < 0.05 * exact and f"…[about {cut} tokens truncated]" in text
    assert text.startswith(content[:200]) and len(encode(text.split("\n…[")[0])) <= 257

    seen.clear()
    short = content[:30_000]
    text, cut = r.truncate(short, 256)
    assert cut == len(encode(short)) - 256 and f"…[{cut} tokens truncated]" in text
    assert r.truncate("ok", 256) == ("ok", 0)


async def test_infra_failures_end_one_episode_and_spare_the_group(qwen_tokenizer):
    class Broken(FlakyEnv):
        async def start(self):
            if self.task.id == "broken":
                raise OSError("dataset shard missing")
            return await super().start()

    tasks = [Task(id="broken", data={"prompt": "x"}), Task(id="down", data={"prompt": "x"}),
             Task(id="fine", data={"prompt": "x"})]  # fmt: skip

    def script(p, t):
        return call(name="flaky", mode="down") if "down" in p and t == 0 else "done"

    ro = Rollout(ScriptedEngine(qwen_tokenizer, script), qwen_tokenizer, Broken,
                 RolloutConfig(group_size=2))  # fmt: skip
    tasks[1].data["prompt"] = "down"
    groups = await ro.run(tasks)
    assert [t.stop_reason for t in groups[0]] == [StopReason.ABORTED] * 2
    assert "dataset shard missing" in groups[0][0].error
    assert [t.stop_reason for t in groups[1]] == [StopReason.SANDBOX_UNAVAILABLE] * 2
    assert all(t.reward == 0.0 and t.stop_reason.is_infra_failure for g in groups[:2] for t in g)
    assert [t.stop_reason for t in groups[2]] == [StopReason.COMPLETED] * 2
    assert all(t.reward == 1.0 for t in groups[2])


class Stall(Tool):
    name, description = "stall", "waits, as a policy's code can"

    class Args(BaseModel):
        pass

    async def __call__(self, args, ctx):
        await asyncio.sleep(0.15)
        return ToolResult(content="ok")


class StallEnv(ToolEnv):
    tools = [Stall()]

    async def reward(self, trajectory):
        return 0.0


class SlowEngine(ScriptedEngine):
    async def generate(self, input_ids, params, key=None):
        await asyncio.sleep(0.3)
        return await super().generate(input_ids, params, key)


async def test_an_episode_timeout_is_the_policys_when_its_tools_took_the_time(qwen_tokenizer):
    """A red-team policy called a tool that waited just under the tool timeout, turn after turn,
    until the episode timed out: `aborted`, out of its group's baseline, its loss hidden. Now an
    episode whose finished tool calls took half its time or more ends `timeout`, scored; one that
    a slow engine held stays the system's (`aborted`)."""
    cfg = RolloutConfig(episode_timeout_s=1.0, max_turns=100)
    staller = Rollout(ScriptedEngine(qwen_tokenizer, lambda p, t: call(name="stall")),
                      qwen_tokenizer, StallEnv, cfg)  # fmt: skip
    traj = await staller.run_episode(TASK)
    assert traj.stop_reason is StopReason.TIMEOUT and not traj.stop_reason.is_infra_failure
    assert traj.reward == 0.0 and "in its tool calls" in traj.error
    slow = Rollout(SlowEngine(qwen_tokenizer, lambda p, t: call(name="stall")),
                   qwen_tokenizer, StallEnv, cfg)  # fmt: skip
    traj = await slow.run_episode(TASK)
    assert traj.stop_reason is StopReason.ABORTED and traj.stop_reason.is_infra_failure
    assert StopReason.of_timeout(5.0, 10.0) is StopReason.TIMEOUT
    assert StopReason.of_timeout(4.9, 10.0) is StopReason.ABORTED


class Exits(Tool):
    name, description = "exits", "a CLI wrapper: argparse exits on a bad flag"

    class Args(BaseModel):
        flag: str

    def __call__(self, args, ctx):  # a plain def: it runs in a thread
        import argparse

        argparse.ArgumentParser(prog="x").parse_args([args.flag])
        return ToolResult(content="ok")


class ExitsEnv(ToolEnv):
    tools = [Exits()]

    async def step(self, turn):
        if "exit-env" in turn.text:
            raise SystemExit(3)
        return await super().step(turn)

    async def reward(self, trajectory):
        return 0.0


async def test_a_sys_exit_in_a_tool_or_an_env_ends_an_episode_never_the_run(qwen_tokenizer):
    """A red-team pass: argparse in a tool, given a bad flag by the policy, raised SystemExit,
    which asyncio re-raises out of the event loop: the trainer exited. A tool's is its own fault
    (an error observation), an env's aborts that episode with its traceback."""

    def script(prompt, turn):
        return call(name="exits", flag="--bogus") if turn == 0 else "done"

    tool = Rollout(ScriptedEngine(qwen_tokenizer, script), qwen_tokenizer, ExitsEnv,
                   RolloutConfig(group_size=2))  # fmt: skip
    group = await tool.run_group(TASK)
    assert [t.stop_reason for t in group] == [StopReason.COMPLETED] * 2
    assert [o.status for o in group[0].turns[0].tool_outcomes] == ["exception"]
    assert "sys.exit(2) was called" in group[0].turns[0].observations[0].content
    env = Rollout(ScriptedEngine(qwen_tokenizer, lambda p, t: "exit-env"), qwen_tokenizer,
                  ExitsEnv, RolloutConfig(group_size=2))  # fmt: skip
    group = await env.run_group(TASK)
    assert [t.stop_reason for t in group] == [StopReason.ABORTED] * 2
    assert "sys.exit(3) was called" in group[0].error


class Fragile(FlakyEnv):
    """A user env's reward that reads the answer tag and raises without one, and a shaping
    reward per turn from the model's number (NaN for "nan")."""

    async def step(self, turn):
        result = await super().step(turn)
        if turn.text.startswith("shape"):
            result.reward = -abs(float(turn.text.split()[1]) - 42)
        return result

    async def reward(self, trajectory):
        return float(trajectory.messages[-1].content.split("<answer>")[1].split("</answer>")[0])


async def test_rewards_the_policy_can_break_never_let_it_escape(qwen_tokenizer):
    """Red-team passes: a reward that raised on a cut answer turned `length` into
    `reward_error`, escaping rollout.truncated's penalty and mask; a NaN turn reward made its
    whole group NaN; a reward of -1e200 overflowed its group's statistics."""
    cut = make(qwen_tokenizer, lambda p, t: "<answer>5 " + "and so on " * 40, Fragile,
               max_new_tokens=20)  # fmt: skip
    traj = await cut.run_episode(TASK)
    assert traj.stop_reason is StopReason.LENGTH and traj.reward == 0.0  # still truncated
    assert "reward: Traceback" in traj.error
    nan = await make(qwen_tokenizer, lambda p, t: "shape nan", Fragile).run_episode(TASK)
    assert nan.stop_reason is StopReason.REWARD_ERROR and nan.reward == 0.0
    assert nan.turns[0].reward == 0.0 and "not a finite number" in nan.error
    huge = make(qwen_tokenizer, lambda p, t: "shape 1e200", Fragile, max_turns=1)
    assert (await huge.run_episode(TASK)).turns[0].reward == -1e6  # REWARD_BOUND
    assert read_reward(1e200) == (1e6, {}) and read_reward({"total": -1e300})[0] == -1e6


async def test_an_env_step_that_raises_on_the_policys_turn_is_scored_not_hidden(qwen_tokenizer):
    """A red-team pass: a user env's step that parses the model's number (`float(text)`) raised on
    "nan-ish" text, and the episode was `aborted`: out of its group's baseline, its loss hidden.
    It is `env_error` now: scored 0, in the baseline, counted as a crash (guards)."""
    from agentrl.guards import crashed

    class Parses(FlakyEnv):
        async def step(self, turn):
            float(turn.text)
            return await super().step(turn)

    traj = await make(qwen_tokenizer, lambda p, t: "forty-two", Parses).run_episode(TASK)
    assert traj.stop_reason is StopReason.ENV_ERROR and not traj.stop_reason.is_infra_failure
    assert traj.reward == 0.0 and "could not convert string to float" in traj.error
    assert crashed(traj)


async def test_reward_dict_needs_total(qwen_tokenizer):
    class NoTotal(FlakyEnv):
        async def reward(self, trajectory):
            return {"correct": 1.0}

    traj = await make(qwen_tokenizer, lambda p, t: "done", NoTotal).run_episode(TASK)
    assert traj.stop_reason is StopReason.REWARD_ERROR and "total" in traj.error


@pytest.mark.parametrize("bad", ["raise", float("nan"), float("inf")])
async def test_a_failing_reward_is_scored_zero_and_kept_not_infra(qwen_tokenizer, bad):
    class BadReward(FlakyEnv):
        async def reward(self, trajectory):
            if bad == "raise":
                raise KeyError("answer")
            return bad

    traj = await make(qwen_tokenizer, lambda p, t: "done", BadReward).run_episode(TASK)
    assert traj.stop_reason is StopReason.REWARD_ERROR and traj.reward == 0.0
    assert not traj.stop_reason.is_infra_failure  # stays in its group's baseline, visible
    assert "Traceback" in traj.error  # the whole traceback, for the trainer to show


async def test_a_template_error_during_a_run_stops_it_instead_of_aborting(qwen_tokenizer):
    from agentrl.render import RenderError

    class BadObservation(FlakyEnv):
        async def step(self, turn):
            raise RenderError("template cannot render this")

    with pytest.raises(RenderError, match="template cannot render"):
        await make(qwen_tokenizer, lambda p, t: "done", BadObservation).run_episode(TASK)


def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="max_turn"):
        RolloutConfig(max_turn=3)


async def test_sandbox_down_ends_with_sandbox_unavailable_and_is_not_scored(qwen_tokenizer):
    """A real service client pointed at a closed loopback port: retries, then the episode stops
    with sandbox_unavailable, and GRPO leaves it out of the group baseline."""
    from agentrl.advantage import AdvantageConfig, compute_advantages
    from agentrl.sandbox import SandboxConfig, make_sandbox

    sb = make_sandbox(SandboxConfig(backend="service", url=f"http://127.0.0.1:{_closed_port()}",
                                    retries=2, backoff_s=0.01))  # fmt: skip
    ok = Rollout(ScriptedEngine(qwen_tokenizer, lambda p, t: "<answer>-39122</answer>"),
                 qwen_tokenizer, CodeExecEnv, RolloutConfig())  # fmt: skip
    down = Rollout(ScriptedEngine(qwen_tokenizer, solver), qwen_tokenizer, CodeExecEnv,
                   RolloutConfig(), sandbox=sb)  # fmt: skip
    group = [await ok.run_episode(TASK, 0), await down.run_episode(TASK, 1)]
    await sb.aclose()
    assert group[1].stop_reason is StopReason.SANDBOX_UNAVAILABLE and "127.0.0.1" in group[1].error
    adv = compute_advantages([group], AdvantageConfig(name="grpo"))
    assert float(adv.advantages[1].abs().sum()) == 0.0
    assert adv.metrics  # the failure is counted, not scored 0


class EchoEnv(ToolEnv):
    async def step(self, turn):
        return StepResult(messages=[Message(role="tool", content="ok")])

    async def reward(self, trajectory):
        return 0.0


async def test_ignore_eos_gives_fixed_length_turns_that_do_not_end_the_episode(qwen_tokenizer):
    """For benchmarks: ignore_eos reaches the engine; a turn cut at max_new_tokens goes on."""
    ro = make(qwen_tokenizer, lambda p, t: "word " * 50, env=EchoEnv, max_new_tokens=8,
              max_turns=3, ignore_eos=True)  # fmt: skip
    seen, generate = [], ro.engine.generate

    async def spy(ids, params, key=None):
        seen.append(params)
        return await generate(ids, params, key)

    ro.engine.generate = spy
    traj = await ro.run_episode(TASK)
    assert traj.stop_reason is StopReason.MAX_TURNS and traj.error is None
    assert [t.end - t.start for t in traj.turns] == [8, 8, 8]
    assert all(t.finish_reason is FinishReason.LENGTH for t in traj.turns)
    assert [p.ignore_eos for p in seen] == [True] * 3 and sum(traj.loss_mask) == 24


class SlowOrFastEnv(CodeExecEnv):
    """Tasks named slow-* block in their tool turn (a stuck episode); records closes."""

    closed: list[str] = []

    async def step(self, turn):
        if self.task.id.startswith("slow"):
            await asyncio.sleep(3600)
        return await super().step(turn)

    async def close(self):
        SlowOrFastEnv.closed.append(self.task.id)
        await super().close()


async def test_over_sampling_keeps_the_first_groups_and_cancels_the_rest(qwen_tokenizer):
    SlowOrFastEnv.closed = []
    ro = make(qwen_tokenizer, solver, env=SlowOrFastEnv, group_size=3)
    tasks = [Task(id=i, data=TASK.data) for i in ("slow-a", "fast-b", "slow-c", "fast-d")]
    groups = await asyncio.wait_for(ro.run(tasks, keep=2), timeout=30)
    assert [g[0].task_id for g in groups] == ["fast-b", "fast-d"]  # in launch order
    assert all(t.reward == 1.0 for g in groups for t in g)
    # every episode of the dropped groups was cancelled and its env closed
    assert sorted(SlowOrFastEnv.closed) == sorted(["fast-b", "fast-d", "slow-a", "slow-c"] * 3)
    assert ro.engine.inflight == 0

"""The gateway (agentrl/gateway/) against the real dev server, with agents written on the real
`openai` SDK: every sampled turn an agent's episode recorded is exactly what the engine returned
for exactly the ids it was asked with; a history rewrite forks a second token-exact sequence;
streaming carries tool calls; failures become the episode's outcome, never a crashed run."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from gateway_record import assert_token_exact, rollout_of
from transformers import AutoTokenizer

from agentrl.advantage import AdvantageConfig, compute_advantages
from agentrl.agent_env import AgentEnv
from agentrl.assets.build import resolve_builtin
from agentrl.engine import EngineClient, EngineConfig, launch_engines
from agentrl.envs.examples.agent_openai import SYSTEM, TOOLS, AddAgent, add_tasks
from agentrl.envs.examples.agent_openai_agents import AddAgentSDK
from agentrl.gateway import Gateway, GatewayConfig, GenerationDefaults
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import FinishReason, StopReason, Task, Trajectory

TINY = resolve_builtin("tiny")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launch_engines(EngineConfig(), TINY, tmp_path_factory.mktemp("logs")) as urls:
        yield urls


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY)


def test_an_openai_sdk_agent_is_recorded_token_exact(server, tok):
    groups, rec = asyncio.run(rollout_of(server, tok, AddAgent, add_tasks(3), group_size=4))
    trajs = [t for g in groups for t in g]
    assert len(trajs) == 12 and all(t.stop_reason is StopReason.COMPLETED for t in trajs)
    assert max(len(t.turns) for t in trajs) >= 2, "the tiny model calls the add tool"
    for t in trajs:
        assert_token_exact(t, rec)
        gw = t.metadata["gateway"]
        assert gw["start"] == 1 and gw.get("fork", 0) == 0 and gw["requests"] == len(t.turns)
        assert gw.get("extend", 0) == len(t.turns) - 1  # every later request extended
        ids = [c.id for turn in t.turns for c in turn.assistant.tool_calls]
        assert len(ids) == len(set(ids)) == gw.get("tool_calls", 0)  # unique in the episode
    # the observation between turns is the template's delta: the tool result, masked
    two = next(t for t in trajs if len(t.turns) >= 2)
    obs = tok.decode(two.token_ids[two.turns[0].end : two.turns[0].obs_end])
    assert "<tool_response>" in obs and set(
        two.loss_mask[two.turns[0].end : two.turns[0].obs_end]
    ) == {0}
    assert len(rec.calls) == sum(len(t.turns) for t in trajs)


class Rewriter(AgentEnv):
    """Calls the add tool, then rewrites its history (drops its own turn and the tool result,
    folds the result into the user message) before asking for the answer."""

    @classmethod
    def load_tasks(cls, n: int = 2, seed: int = 0) -> list[Task]:
        return add_tasks(n)

    async def run(self, task: Task, client: Any) -> float:
        prompt = task.data["prompt"]
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        await client.chat.completions.create(model="m", messages=first, tools=TOOLS)
        rewritten = [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": f"{prompt} (a tool said: {task.data['answer']})"}]  # fmt: skip
        out = await client.chat.completions.create(model="m", messages=rewritten, tools=TOOLS)
        return float((out.choices[0].message.content or "").strip() == task.data["answer"])


def test_a_rewritten_history_forks_two_token_exact_sequences(server, tok):
    groups, rec = asyncio.run(rollout_of(server, tok, Rewriter, add_tasks(2), group_size=3))
    for group in groups:
        assert len(group) == 6  # three episodes, two sequences each
        for t in group:
            assert_token_exact(t, rec)
            assert len(t.turns) == 1 and t.stop_reason is StopReason.COMPLETED
        firsts, seconds = group[0::2], group[1::2]
        assert [t.metadata["origin"] for t in group] == ["start", "fork"] * 3
        assert all(t.metadata["gateway"]["fork"] == 1 for t in firsts)
        for a, b in zip(firsts, seconds, strict=True):
            assert a.metadata["session"] == b.metadata["session"] and a.reward == b.reward
            # the fork's prompt is the rewritten request rendered whole; nothing of the first
            # sequence's sampled turn is in it
            assert "(a tool said:" in tok.decode(b.token_ids[: b.prompt_len])
            assert (
                b.prompt_len == b.turns[0].start
                and sum(b.loss_mask) == b.turns[0].end - b.turns[0].start
            )
    # the baseline counts an episode once: both sequences of an episode get its advantage
    for t, reward in zip(groups[0], [1.0, 1.0, 0.0, 0.0, 0.0, 0.0], strict=True):
        t.reward = reward
    adv = compute_advantages([groups[0]], AdvantageConfig(name="drgrpo")).advantages
    per_seq = [float(a[t.turns[0].start]) for a, t in zip(adv, groups[0], strict=True)]
    assert per_seq == pytest.approx([2 / 3, 2 / 3, -1 / 3, -1 / 3, -1 / 3, -1 / 3])


def test_streaming_answers_carry_the_tool_calls_the_plain_answer_has(server, tok):
    """The same request, seeded alike, streamed and not: the streamed chunks rebuild the same
    message (content, tool call ids, names, arguments) and finish reason, and report usage."""

    async def go():
        async with EngineClient(server) as engine:
            gw = Gateway(engine, tok, Rollout.prepare(tok, AddAgent, RolloutConfig())[1])
            url = await gw.start()
            try:
                for seed in range(16):  # the first seed whose answer calls the tool
                    answers = await both(gw, url, f"seed-{seed}")
                    if answers[0][1]:
                        return answers
                raise AssertionError(f"no seed of 16 gave a tool call: {answers}")
            finally:
                await gw.aclose()

    async def both(gw, url, seed):
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What is 20 + 21?"},
        ]
        answers = []
        for stream in (False, True):
            ep = gw.open("t", 0, f"s{stream}", seeds=seed)
            async with openai.AsyncOpenAI(base_url=url, api_key=ep.key, max_retries=0) as client:
                ask = client.chat.completions.create
                if not stream:
                    out = await ask(model="m", messages=msgs, tools=TOOLS)
                    m = out.choices[0].message
                    calls = [(c.id, c.function.name, json.loads(c.function.arguments))
                             for c in m.tool_calls or []]  # fmt: skip
                    answers.append((m.content, calls, out.choices[0].finish_reason,
                                    out.usage.completion_tokens))  # fmt: skip
                    continue
                chunks = await ask(model="m", messages=msgs, tools=TOOLS, stream=True,
                                   stream_options={"include_usage": True})  # fmt: skip
                content, parts, finish, usage = "", {}, None, None
                async for ch in chunks:
                    if ch.usage is not None:
                        usage = ch.usage.completion_tokens
                    for c in ch.choices:
                        content += c.delta.content or ""
                        finish = c.finish_reason or finish
                        for tc in c.delta.tool_calls or []:
                            got = parts.setdefault(tc.index, [tc.id, "", ""])
                            got[1] += tc.function.name or ""
                            got[2] += tc.function.arguments or ""
                calls = [(i, n, json.loads(a)) for i, n, a in parts.values()]
                answers.append((content or None, calls, finish, usage))
        return answers

    plain, streamed = asyncio.run(go())
    assert plain == streamed
    assert plain[1] and plain[1][0][1] == "add" and plain[2] == "tool_calls", plain


class Failing(AgentEnv):
    """One behaviour per task: raise, never call the model, run past the request budget, send
    a request the gateway refuses."""

    @classmethod
    def load_tasks(cls, n: int = 4, seed: int = 0) -> list[Task]:
        return [Task(id=k, data={}) for k in ("raise", "silent", "budget", "refused")]

    async def run(self, task: Task, client: Any) -> float:
        msgs = [{"role": "user", "content": "What is 1 + 2?"}]
        if task.id == "raise":
            await client.chat.completions.create(model="m", messages=msgs)
            raise KeyError("the agent's own bug")
        if task.id == "silent":
            return 1.0
        if task.id == "budget":
            for _ in range(5):  # rollout.gateway.max_requests=3
                await client.chat.completions.create(model="m", messages=msgs)
        if task.id == "refused":
            try:
                await client.chat.completions.create(model="m", messages=msgs,
                                                     tool_choice="required", tools=TOOLS)  # fmt: skip
            except openai.BadRequestError as e:
                assert "tool_choice" in str(e)
            out = await client.chat.completions.create(model="m", messages=msgs)
            async with openai.AsyncOpenAI(
                base_url=str(client.base_url), api_key="nope", max_retries=0
            ) as bogus:
                with pytest.raises(openai.AuthenticationError):
                    await bogus.chat.completions.create(model="m", messages=msgs)
            return float(bool(out.choices))
        return 1.0


def test_failures_are_the_episodes_outcomes(server, tok):
    groups, _ = asyncio.run(rollout_of(server, tok, Failing, Failing.load_tasks(), group_size=1,
                                       gateway=GatewayConfig(max_requests=3)))  # fmt: skip
    by = {g[0].task_id: g for g in groups}
    (r,) = by["raise"]
    assert r.stop_reason is StopReason.AGENT_ERROR and r.reward == 0.0 and r.num_sampled > 0
    assert 'KeyError: "the agent\'s own bug"' in r.error  # kept in its group, scored, visible
    (s,) = by["silent"]
    assert s.stop_reason is StopReason.ABORTED and "without calling the model" in s.error
    assert s.num_sampled == 0  # nothing to train; out of the baseline
    b = by["budget"]
    assert {t.stop_reason for t in b} == {StopReason.MAX_TURNS} and b[0].reward == 0.0
    assert "max_requests=3" in b[0].error and b[0].metadata["gateway"]["requests"] == 3
    (f,) = by["refused"]
    assert f.stop_reason is StopReason.COMPLETED and f.reward == 1.0
    assert f.metadata["gateway"]["bad_requests"] == 1 and f.metadata["gateway"]["requests"] == 1


class Stalling(AgentEnv):
    """Asks the model once, then waits in its "tools" past the episode's time limit: the time
    went outside sampling, so the timeout is the policy's (scored 0, in the baseline), where it
    used to be `aborted` and out of it."""

    async def run(self, task: Task, client: Any) -> float:
        msgs = [{"role": "user", "content": "What is 1 + 2?"}]
        await client.chat.completions.create(model="m", messages=msgs)
        await asyncio.sleep(30)
        return 1.0


class RaisesOnACutReply(AgentEnv):
    """Asks for at most 2 tokens, then parses the reply as JSON, as an agent does: the cut reply
    makes it raise."""

    async def run(self, task: Task, client: Any) -> float:
        msgs = [{"role": "user", "content": "What is 1 + 2?"}]
        out = await client.chat.completions.create(model="m", messages=msgs, max_tokens=2)
        assert out.choices[0].finish_reason == "length"
        return json.loads(out.choices[0].message.content or "")


def test_an_agent_that_raises_on_a_cut_reply_is_truncated(server, tok):
    """A red-team pass: such an episode was `agent_error` (scored 0), escaping
    rollout.truncated's penalty and mask. A cut last turn is truncation whatever the agent did."""
    groups, _ = asyncio.run(rollout_of(server, tok, RaisesOnACutReply, [Task(id="cut", data={})],
                                       group_size=1, truncated="penalise",
                                       truncated_reward=-1.0))  # fmt: skip
    ((t,),) = groups
    assert t.stop_reason is StopReason.LENGTH and "JSONDecodeError" in t.error


class RetriesAfterACutReply(AgentEnv):
    """Asks for at most 2 tokens, drops the cut reply and asks again in full: two sequences
    (the second history does not extend the first), the last one complete."""

    async def run(self, task: Task, client: Any) -> float:
        msgs = [{"role": "user", "content": "What is 1 + 2?"}]
        out = await client.chat.completions.create(model="m", messages=msgs, max_tokens=2)
        assert out.choices[0].finish_reason == "length"
        msgs = [{"role": "user", "content": "What is 1 + 2? Answer in full."}]
        await client.chat.completions.create(model="m", messages=msgs)
        return 1.0


def test_a_cut_reply_the_agent_went_on_from_is_not_the_episodes_truncation(server, tok):
    """Red-team finding of stop 55: each sequence took its own stop, so the first, cut, was
    `length`, and under penalise the group baseline (it reads an episode's first sequence)
    counted the episode at -1 while its last sequence trained at +1. One stop per episode now,
    from the sequence of the latest answer."""
    groups, _ = asyncio.run(rollout_of(server, tok, RetriesAfterACutReply,
                                       [Task(id="retry", data={})], group_size=1,
                                       truncated="penalise", truncated_reward=-1.0))  # fmt: skip
    (seqs,) = groups
    assert len(seqs) == 2 and seqs[0].turns[-1].finish_reason is FinishReason.LENGTH
    assert {t.stop_reason for t in seqs} == {StopReason.COMPLETED}
    assert {t.reward for t in seqs} == {1.0}


def test_an_agent_that_stalls_past_the_time_limit_is_scored(server, tok):
    groups, _ = asyncio.run(rollout_of(server, tok, Stalling, [Task(id="stall", data={})],
                                       group_size=1, episode_timeout_s=2.0))  # fmt: skip
    ((t,),) = groups
    assert t.stop_reason is StopReason.TIMEOUT and t.reward == 0.0 and t.num_sampled > 0
    assert "s of it sampling" in t.error


def test_a_command_agent_gets_the_url_key_and_task(server, tok, tmp_path: Path):
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os\nfrom openai import OpenAI\n"
        "task = json.loads(os.environ['AGENTRL_TASK'])\n"
        "c = OpenAI(max_retries=0)\n"  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
        "out = c.chat.completions.create(model='m', messages=[{'role': 'user', 'content': task['prompt']}])\n"
        "print(json.dumps({'total': 0.5, 'answered': float(bool(out.choices[0].message.content))}))\n"
    )

    class Cmd(AgentEnv):
        command = ["python", str(script)]

    groups, rec = asyncio.run(rollout_of(server, tok, Cmd, add_tasks(1), group_size=2))
    for t in groups[0]:
        assert t.stop_reason is StopReason.COMPLETED and t.reward == 0.5
        assert set(t.reward_components) == {"total", "answered"}
        assert_token_exact(t, rec)


def test_a_request_in_flight_across_a_weight_push_goes_on_as_segments(server, tok, tmp_path):
    """trainer.async.partial_rollouts: a push (`exclusive(pause=True)`, new weights from disk)
    cuts a chat completion the gateway is sampling; it goes on under the new weights and the
    agent gets one whole answer. The recorded turn says which ids which version sampled."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(tmp_path / "pushed")
    n = 400

    async def go():
        async with EngineClient(server) as engine:
            v0 = (await engine.control.get_weight_version())[0]
            parser = Rollout.prepare(tok, AddAgent, RolloutConfig())[1]
            defaults = GenerationDefaults(max_new_tokens=n, ignore_eos=True)
            gw = Gateway(engine, tok, parser, GatewayConfig(max_sampled_tokens=n), defaults)
            url = await gw.start()
            ep = gw.open("t", 0, "push")
            client = openai.AsyncOpenAI(base_url=url, api_key=ep.key, max_retries=0)
            msgs = [{"role": "user", "content": "Count to a thousand."}]
            ask = asyncio.create_task(client.chat.completions.create(model="m", messages=msgs))
            try:
                for _ in range(500):
                    info = await engine.control.server_info()
                    if info[0]["internal_states"][0]["num_running_reqs"]:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.3)
                async with engine.exclusive(pause=True) as inflight:
                    assert inflight == 1
                    await engine.control.update_weights_from_disk(
                        str(tmp_path / "pushed"), weight_version="pushed-1"
                    )
                out = await asyncio.wait_for(ask, 120)
            finally:
                await engine.control.update_weights_from_disk(str(TINY), weight_version=v0)
                await client.close()
                await gw.aclose()
            return out, gw.close(ep), v0

    out, ep, v0 = asyncio.run(go())
    (cap,) = ep.trained()
    (turn,) = cap.seq.turns
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == n
    assert [v for _, v in turn.segments] == [v0, "pushed-1"] and 0 < turn.segments[0][0] < n
    assert turn.end - turn.start == n and sum(cap.seq.mask) == n


class ResponsesSDK(AddAgentSDK):
    """The OpenAI Agents SDK example on the SDK's default model, the Responses API."""

    api = "responses"


def test_the_agents_sdk_on_the_responses_api_extends_its_sequences(server, tok):
    groups, rec = asyncio.run(rollout_of(server, tok, ResponsesSDK, add_tasks(3), group_size=4))
    trajs = [t for g in groups for t in g]
    assert all(t.stop_reason is StopReason.COMPLETED for t in trajs), [t.error for t in trajs]
    assert max(len(t.turns) for t in trajs) >= 2 and any(t.reward == 1.0 for t in trajs)
    for t in trajs:
        assert_token_exact(t, rec)
        gw = t.metadata["gateway"]
        assert gw.get("fork", 0) == 0 and gw.get("extend", 0) == len(t.turns) - 1


def test_the_standalone_gateway_records_an_agent_run_by_hand(tmp_path):
    """`agentrl gateway`: episodes opened and closed with the admin token; a closed episode's
    sequences are written token-exact with the reward given at close."""
    import httpx

    from agentrl.cli.gateway import serve
    from agentrl.config import compose

    cfg = compose(["rollout.max_new_tokens=48"])

    async def go():
        started = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(cfg, tmp_path, started))
        try:
            app = await asyncio.wait_for(started, 60)
            root = app.gateway.url.removesuffix("/v1")
            admin = {"Authorization": f"Bearer {app.token}"}
            async with httpx.AsyncClient() as http:
                assert (await http.post(f"{root}/admin/episodes")).status_code == 401
                ep = (await http.post(f"{root}/admin/episodes", headers=admin)).json()
                async with openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["key"],
                                              max_retries=0) as client:  # fmt: skip
                    msgs = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": "What is 3 + 4?"}]  # fmt: skip
                    out = await client.chat.completions.create(model="m", messages=msgs,
                                                               tools=TOOLS)  # fmt: skip
                    msgs.append(out.choices[0].message.model_dump(exclude_none=True))
                    msgs.append({"role": "user", "content": "And the answer?"})
                    await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
                closed = await http.post(f"{root}/admin/episodes/{ep['key']}/close",
                                         headers=admin, json={"reward": 0.5})  # fmt: skip
                return closed.json()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    summary = asyncio.run(go())
    assert summary["gateway"]["start"] == 1 and summary["gateway"]["extend"] == 1
    (row,) = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    t = Trajectory.from_dict(row)
    assert t.reward == 0.5 and len(t.turns) == 2 and t.metadata["origin"] == "start"
    t.check()


def test_a_closed_episode_cancels_its_requests_and_its_record_stays_and_budgets_hold(server, tok):
    """An agent that returns with a request still sampling: the request is cancelled, the
    episode's trajectories keep what they held at the end. And `n` samples of one request
    never sample past rollout.gateway.max_sampled_tokens together."""
    from agentrl.agent_rollout import episode_trajectories

    async def go():
        async with EngineClient(server) as engine:
            parser = Rollout.prepare(tok, AddAgent, RolloutConfig())[1]
            defaults = GenerationDefaults(max_new_tokens=300, ignore_eos=True)
            gw = Gateway(engine, tok, parser, GatewayConfig(max_sampled_tokens=400), defaults)
            url = await gw.start()
            try:
                ep = gw.open("t", 0, "closing")
                async with openai.AsyncOpenAI(base_url=url, api_key=ep.key, max_retries=0) as c:
                    msgs = [{"role": "user", "content": "Count."}]
                    first = await c.chat.completions.create(model="m", messages=msgs,
                                                            max_tokens=8)  # fmt: skip
                    msgs += [first.choices[0].message.model_dump(exclude_none=True),
                             {"role": "user", "content": "More."}]  # fmt: skip
                    late = asyncio.create_task(c.chat.completions.create(model="m", messages=msgs))
                    await asyncio.sleep(0.3)  # sampling its 300 tokens
                    gw.close(ep)
                    trajs = episode_trajectories(ep, StopReason.COMPLETED, None)
                    with pytest.raises(openai.APIError):
                        await late
                    await asyncio.sleep(0.2)
                    again = episode_trajectories(ep, StopReason.COMPLETED, None)
                budget = gw.open("t", 1, "budget")
                async with openai.AsyncOpenAI(base_url=url, api_key=budget.key,
                                              max_retries=0) as c:  # fmt: skip
                    with contextlib.suppress(openai.BadRequestError):
                        await c.chat.completions.create(model="m", n=4, messages=[
                            {"role": "user", "content": "Count."}])  # fmt: skip
                return trajs, again, gw.close(budget)
            finally:
                await gw.aclose()

    trajs, again, budget = asyncio.run(go())
    assert len(trajs) == 1 and len(trajs[0].turns) == 1 and trajs[0].num_sampled == 8
    assert [t.token_ids for t in again] == [t.token_ids for t in trajs]  # nothing was added
    assert budget.sampled_tokens <= 400 and budget.stop is StopReason.LENGTH

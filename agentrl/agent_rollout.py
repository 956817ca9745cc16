"""The episodes of an AgentEnv (agentrl/agent_env.py): the user's agent runs against the
gateway (agentrl/gateway/) with its episode's key, and each training sequence the gateway
recorded becomes a Trajectory scored with the episode's reward.

`Rollout` (agentrl/rollout.py) hands its AgentEnv episodes here; groups, async training,
dynamic sampling, evaluation and the logs then see ordinary trajectories. The sequences of one
episode share `metadata["session"]`: the group baseline counts the episode once
(agentrl/advantage.py), and every sequence gets its advantage."""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import traceback
import uuid
from collections.abc import Mapping
from typing import Any

import openai

from agentrl.agent_env import AgentEnv
from agentrl.agent_workers import AgentRaised, AgentWorkerDied, AgentWorkers, Job, openai_client
from agentrl.engine import EngineUnavailable
from agentrl.env import Env, read_reward
from agentrl.gateway import EpisodeCapture, Gateway
from agentrl.repeats import warn_episode
from agentrl.seeding import episode_key
from agentrl.tool import ToolContext, no_exit
from agentrl.types import ConfigError, FinishReason, StopReason, Task, Trajectory

log = logging.getLogger(__name__)

NO_REQUESTS = "AgentEnv: the agent returned without calling the model (no requests)"


class AgentEpisodes:
    """Runs AgentEnv episodes through one gateway (started at the first episode)."""

    def __init__(
        self,
        gateway: Gateway,
        env_cls: type[AgentEnv],
        env_kwargs: dict[str, Any],
        sandbox: Any,
        tool_timeout_s: float,
        episode_timeout_s: float,
        reference: Any,
    ) -> None:
        self.gateway, self.env_cls, self.env_kwargs, self.sandbox = (
            gateway,
            env_cls,
            env_kwargs,
            sandbox,
        )
        self.tool_timeout_s, self.episode_timeout_s = tool_timeout_s, episode_timeout_s
        self.reference = reference  # task -> {"reference": …} for people reading trajectories
        self._lock = asyncio.Lock()
        self._http: Any = None
        n = gateway.cfg.agent_workers
        self.workers = AgentWorkers(n) if n and env_cls.command is None else None

    async def aclose(self) -> None:
        if self.workers is not None:
            await self.workers.aclose()
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()
        await self.gateway.aclose()

    def _pool(self) -> Any:
        """The agents' shared connection pool to the gateway (plain HTTP, loopback)."""
        if self._http is None:
            self._http = openai.DefaultAsyncHttpxClient(verify=False)
        return self._http

    async def run_episode(
        self, task: Task, sample_index: int = 0, slot: int = 0
    ) -> list[Trajectory]:
        async with self._lock:
            url = await self.gateway.start()
        session = f"{task.id}:{sample_index}:{uuid.uuid4().hex[:8]}"
        ep = self.gateway.open(
            task.id, sample_index, session, episode_key(task.id, slot, sample_index)
        )
        ctx = ToolContext(
            session=session, sandbox=self.sandbox, timeout_s=self.tool_timeout_s, task=task
        )
        t0 = time.monotonic()
        env: AgentEnv | None = None
        stop, error, returned = StopReason.COMPLETED, None, False
        try:
            env = self.env_cls(task, ctx, **self.env_kwargs)
            # in this task (3.11's wait_for lost a cancel that came as the agent returned);
            # no_exit: an agent's sys.exit is its failure, not ours
            async with asyncio.timeout(self.episode_timeout_s):
                env.result = await no_exit(self._agent(env, task, session, url, ep.key))
            returned = True
        except asyncio.CancelledError:
            self.gateway.close(ep)
            if env is not None:
                await _close(env, session)
            raise
        except TimeoutError:  # the policy's when the time went outside its sampling (tools)
            elapsed = time.monotonic() - t0
            gen_s = sum(t.gen_latency_s for c in ep.sequences for t in c.seq.turns)
            stop = StopReason.of_timeout(elapsed - gen_s, elapsed)
            error = (f"episode exceeded rollout.episode_timeout_s={self.episode_timeout_s:g} "
                     f"({gen_s:.1f} s of it sampling)")  # fmt: skip
        except EngineUnavailable as e:
            stop, error = StopReason.ABORTED, f"EngineUnavailable: {e}"
        except AgentWorkerDied as e:
            stop, error = StopReason.ABORTED, str(e)
        except ConfigError:
            raise
        except AgentRaised as e:
            log.warning("agent of episode %s raised (in its worker): %s", session, e)
            stop, error = StopReason.AGENT_ERROR, e.tb
        except Exception as e:
            log.warning("agent of episode %s raised: %s: %s", session, type(e).__name__, e)
            stop, error = StopReason.AGENT_ERROR, traceback.format_exc()
        self.gateway.close(ep)
        release = getattr(self.gateway.engine, "release", None)
        if release is not None:  # the engine client forgets which server the episode stuck to
            release(session)
        if ep.stop is not None:  # a budget or the engine decided first; the agent only reacted
            stop, error = ep.stop, ep.error if error is None else f"{ep.error}\n{error}"
        trajs = episode_trajectories(ep, stop, error, self.reference(task))
        if env is not None and returned:  # an agent that raised has no result: scored 0
            await self._score(env, trajs, session)
            await _close(env, session)
        for t in trajs:
            t.metadata["episode_s"] = time.monotonic() - t0
        return trajs

    async def _agent(self, env: AgentEnv, task: Task, session: str, url: str, key: str) -> Any:
        """`env.run(task, client)` here, or in an agent worker (rollout.gateway.agent_workers),
        whose env's attributes set by `run` are copied onto `env`."""
        if self.workers is None:
            return await env.run(
                task, openai_client(url, key, self.episode_timeout_s, self._pool())
            )
        copy_of = getattr(self.sandbox, "worker_copy", None)  # the service's: one client each
        job = Job(type(env), task, self.env_kwargs, session, self.tool_timeout_s,
                  copy_of() if copy_of is not None else None,
                  "" if self.sandbox is None else type(self.sandbox).__name__, url,
                  key, self.episode_timeout_s)  # fmt: skip
        result, state = await self.workers.run(job)
        env.__dict__.update(state)
        return result

    async def _score(self, env: AgentEnv, trajs: list[Trajectory], session: str) -> None:
        """The episode's reward on each of its sequences, when its agent returned: none for an
        infrastructure failure, else `env.reward` of the sequence of the agent's latest
        answer (`last_sequence`)."""
        last = last_sequence(trajs)
        if last.stop_reason.is_infra_failure:
            return
        try:
            reward, components = read_reward(await env.reward(last))
        except Exception as e:
            warn_episode(log, session, f"reward failed: {type(e).__name__}: {e}")
            for t in trajs:
                t.stop_reason, t.reward = StopReason.REWARD_ERROR, 0.0
                t.error = f"reward: {traceback.format_exc()}"
            return
        for t in trajs:
            t.reward, t.reward_components = reward, dict(components)


def episode_trajectories(
    ep: EpisodeCapture, stop: StopReason, error: str | None, meta: dict[str, Any] | None = None
) -> list[Trajectory]:
    """Each training sequence `ep` recorded as a Trajectory (unscored), in the order they began;
    one empty, `aborted` trajectory when the agent never called the model. They share
    `metadata["session"]` (one episode in the group baseline); the first carries the episode's
    gateway counts (`metadata["gateway"]`)."""
    seqs = ep.trained()
    meta = {"session": ep.session, **(meta or {})}
    gw = {k: float(v) for k, v in ep.counts.items()}
    gw["requests"], gw["sequences"] = float(ep.requests), float(len(seqs))
    if not seqs:
        return [
            Trajectory(
                ep.task_id,
                ep.sample_index,
                [],
                [],
                [],
                0,
                [],
                [],
                StopReason.ABORTED,  # nothing sampled: nothing the policy did to score
                metadata={**meta, "gateway": gw},
                error=NO_REQUESTS
                if stop is StopReason.COMPLETED and error is None
                else f"AgentEnv: nothing was sampled ({stop.value}): {error}",
            )
        ]
    out = []
    for k, cap in enumerate(seqs):
        s = copy.deepcopy(cap.seq)  # the record stays as it is now, whatever comes after
        if cap.busy:  # a request cut by the end of the episode: its delta was never answered
            end = cap.marks[-1]
            del s.ids[end.ids :], s.mask[end.ids :], s.logprobs[end.ids :]
            del s.messages[end.messages :], s.turns[end.turns :]
            s.turns[-1].obs_end, s.turns[-1].observations = s.turns[-1].end, []
        extra = {"sequence": k, "origin": cap.origin, **({"gateway": gw} if k == 0 else {}),
                 **({"last": True} if cap is ep.last else {})}  # fmt: skip
        out.append(s.trajectory(ep.task_id, ep.sample_index, stop, error, {**meta, **extra}))
    # One stop reason per episode, from the sequence of the latest answer: a cut last turn there is
    # truncation, also when the agent raised on the cut reply (a red-team agent's json.loads did,
    # and left rollout.truncated's penalty and mask); an earlier sequence's cut that the agent
    # went on from is not the episode's outcome (the group baseline reads the first sequence, so
    # a per-sequence `length` there was penalised while the trained last one scored)
    cut = last_sequence(out).turns[-1].finish_reason is FinishReason.LENGTH
    if stop in (StopReason.COMPLETED, StopReason.AGENT_ERROR) and cut:
        for t in out:
            t.stop_reason = StopReason.LENGTH
    return out


def last_sequence(trajs: list[Trajectory]) -> Trajectory:
    """The episode's sequence of the agent's latest answer (EpisodeCapture.last: its last
    answered request's, choices[0]'s of an `n` > 1 one, or the one a later request went on
    from): its reward is the episode's, its cut last turn the episode's truncation."""
    return next((t for t in trajs if t.metadata.get("last")), trajs[-1])


async def _close(env: AgentEnv, session: str) -> None:
    try:
        await env.close()
    except Exception as e:
        log.warning("env.close of %s failed: %s", session, e)


def agent_notes(
    classes: Mapping[str, type[Env]],
    max_turns: int | None,
    context_policy: str,
    agent_workers: int,
    engine_kind: str,
) -> list[str]:
    """What a run with AgentEnv classes (by name; "" a single env's) should be told at start, as
    console lines. The rollout settings an agent's episode never reads (its agent runs its own
    loop over its own history; the gateway only records it), rollout.max_turns and
    rollout.context.policy: a ConfigError when every env is an AgentEnv (the setting does
    nothing), a warning in a mixture (only its ToolEnvs read it). Before, both were taken and
    silently not applied: an agent made as many requests as its own loop did, and its episodes
    overflowed under a context policy that never ran."""
    agents = [n or c.__name__ for n, c in classes.items() if issubclass(c, AgentEnv)]
    if not agents:
        return []
    unused = []
    if max_turns is not None:
        unused.append(f"rollout.max_turns={max_turns} (an agent's own loop decides how many "
                      "requests it makes: bound them with rollout.gateway.max_requests, or the "
                      "agent's own setting in env.args)")  # fmt: skip
    if context_policy != "none":
        unused.append(f"rollout.context.policy={context_policy} (an agent sends its own history:"
                      " a request past rollout.max_context_tokens ends its episode "
                      "context_overflow; a history the agent rewrites starts a new sequence)")  # fmt: skip
    if unused and len(agents) == len(classes):
        raise ConfigError(f"{'; '.join(unused)}: no env of this run reads it, every one is an "
                          f"AgentEnv ({', '.join(agents)}). Drop the setting")  # fmt: skip
    notes = [f"[yellow]warning:[/] {u} applies to the ToolEnvs only: not to {', '.join(agents)}"
             for u in unused]  # fmt: skip
    in_loop = any(c.command is None for c in classes.values() if issubclass(c, AgentEnv))
    if in_loop and engine_kind == "sglang" and agent_workers == 0:
        notes.append("[dim]note: the AgentEnv's agents run in the rollout's own event loop; on a "
                     "GPU engine their SDK's CPU per request can limit the run: "
                     "rollout.gateway.agent_workers=16 runs them in processes of their own "
                     "(docs/agents.md)[/]")  # fmt: skip
    return notes

"""Multi-turn rollouts: the token layer between an Env (messages) and an engine (token ids).

    rollout = Rollout(engine, tokenizer, CodeExecEnv, RolloutConfig(group_size=8))
    groups = await rollout.run(tasks)          # list (per task) of list (per sample) of Trajectory

Per episode: render the env's start messages once, then loop — sample with the remaining context
budget, append the sampled ids unchanged (mask 1, their logprobs), parse tool calls, let the env
step (tool calls run concurrently), truncate observations in tokens, append the template delta of
the observations (mask 0). Every episode ends with a StopReason; exceptions are caught here, once,
and become one (`aborted` / `sandbox_unavailable`), so one broken episode never sinks its group.

Run `agentrl preview env=code_exec` to print a few rendered trajectories (agentrl/cli/preview.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.agent_env import AgentEnv
from agentrl.agent_rollout import AgentEpisodes
from agentrl.context import ContextConfig, summarized
from agentrl.engine import EngineUnavailable, PromptTooLong, SamplingParams
from agentrl.env import AssistantTurn, Env, ToolEnv, checked_messages, finish_episode, take_step
from agentrl.gateway import Gateway, GatewayConfig, GenerationDefaults
from agentrl.oversample import run_groups
from agentrl.parsers import (
    PARSERS,
    Parser,
    check_template,
    get_parser,
    resolve_parser,
    template_max_calls,
)
from agentrl.render import Renderer, RenderError, Unrenderable, check_round_trip
from agentrl.repeats import warn_episode
from agentrl.rollout_context import check_summary_history, rewritten, still_full
from agentrl.sandbox.base import Sandbox, SandboxUnavailable
from agentrl.seeding import episode_key, group_slot, turn_seed
from agentrl.sequence import TokenSequence, record_turn
from agentrl.tool import ToolContext, gather_all, no_exit
from agentrl.types import (
    Completion,
    ConfigError,
    EnvStepError,
    FinishReason,
    Message,
    PromptOverflow,
    StopReason,
    Task,
    Trajectory,
    Turn,
)

log = logging.getLogger(__name__)
_TOOL_LESS: set[type] = set()  # ToolEnv classes warned of listing no tools


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(8, ge=1, description="samples per task (GRPO group)")
    max_turns: int | None = Field(None, ge=1, description="overrides the env's max_turns")
    max_new_tokens: int = Field(256, ge=1, description="per assistant turn")
    max_context_tokens: int = Field(2048, ge=16, description="prompt + all turns + observations")
    max_obs_tokens: int = Field(
        256, ge=8, description="each tool output is cut to this many tokens"
    )
    tool_timeout_s: float = Field(10.0, gt=0)
    episode_timeout_s: float = Field(600.0, gt=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    ignore_eos: bool = Field(
        False,
        description="benchmarks: every turn samples exactly max_new_tokens (no stop token) and "
        "a turn that ends at that limit does not end the episode",
    )
    end_of_turn: str | None = Field(
        None,
        description="the token that ends an assistant turn in the chat template, when it is not "
        "the tokenizer's eos_token (Gemma: <end_of_turn>); the engines also stop on it",
    )
    parser: str = Field(
        "auto",
        description="tool-call parser (hermes, qwen3_coder, llama3_json, …); auto: the one that "
        "reads the chat template's own tool-call format",
    )
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    truncated: Literal["train", "mask", "penalise"] = Field(
        "train",
        description="an episode a token budget cut (stop reason length: a turn hit "
        "max_new_tokens; context_overflow: the episode hit max_context_tokens; not max_turns). "
        "train (default, verl's behaviour): scored by the env and trained in full; mask (TRL's "
        "mask_truncated_completions): kept in its group's baseline with its reward, so the "
        "others' advantages do not change, but no gradient of its own (out of the batch); "
        "penalise: its outcome reward is replaced by rollout.truncated_reward before advantages",
    )
    truncated_reward: float = Field(
        0.0, description="rollout.truncated=penalise: the outcome reward of a truncated episode"
    )
    context: ContextConfig = Field(
        default_factory=ContextConfig,
        description="what an episode does when its context fills up (agentrl/context.py)",
    )
    thinking: Literal["keep", "template"] = Field(
        "keep",
        description="what the model reads of its earlier turns. keep (default): the ids it "
        "sampled, reasoning included, one sequence per episode (token-exact, nothing rendered "
        "twice); template: the chat template's rendering of the history at every turn, as "
        "inference serves it (templates that drop earlier reasoning drop it): a turn whose "
        "history renders otherwise than the ids so far starts a new sequence over that "
        "rendering, each sequence trained on its own sampled turns (docs/rollouts.md, thinking)",
    )
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig,
        description="the OpenAI-compatible gateway AgentEnv episodes run through",
    )

    @field_validator("parser")
    @classmethod
    def _known_parser(cls, v: str) -> str:
        return v if v == "auto" else PARSERS.check(v)


ENGINE_DOWN = "EngineUnavailable"  # how an episode that lost its engine begins its error


def engine_lost(tr: Trajectory) -> bool:
    """An episode ended because no rollout server answered (not the env's fault)."""
    return tr.stop_reason.value == "aborted" and (tr.error or "").startswith(ENGINE_DOWN)


class Engine(Protocol):
    async def generate(
        self, input_ids: list[int], params: SamplingParams, key: str | None = None
    ) -> Completion: ...


def _reference(task: Task) -> dict[str, str]:
    """The task's reference answer, when its data names one, for people reading trajectories
    (console panels, the HTML view, the W&B turn table); never shown to the model."""
    for key in ("answer", "expected", "reference", "solution"):
        if key in task.data:
            return {"reference": str(task.data[key])[:500]}
    return {}


class Rollout:
    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        env_cls: type[Env],
        cfg: RolloutConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.engine = engine
        self.env_cls = env_cls
        self.cfg = cfg or RolloutConfig()
        self.env_kwargs = env_kwargs or {}
        self.sandbox = sandbox
        self.renderer, self.parser = self.prepare(tokenizer, env_cls, self.cfg)
        self.tool_args = {t.name: t.Args for t in env_cls.tools}
        self.agents = (
            self._agent_episodes(tokenizer, env_cls) if issubclass(env_cls, AgentEnv) else None
        )

    def _agent_episodes(self, tokenizer: Any, env_cls: type[AgentEnv]) -> AgentEpisodes:
        """An AgentEnv's episodes run through a gateway that samples as this rollout does."""
        c = self.cfg
        defaults = generation_defaults(c, self.renderer)
        gateway = Gateway(self.engine, tokenizer, self.parser, c.gateway, defaults)
        return AgentEpisodes(gateway, env_cls, self.env_kwargs, self.sandbox,
                             c.tool_timeout_s, c.episode_timeout_s, _reference)  # fmt: skip

    async def aclose(self) -> None:
        """Stop what the rollout started (an AgentEnv's gateway)."""
        if self.agents is not None:
            await self.agents.aclose()

    @staticmethod
    def prepare(tokenizer: Any, env_cls: type[Env], cfg: RolloutConfig) -> tuple[Renderer, Parser]:
        """The renderer and the tool-call parser, checked against the chat template with one
        whole tool round trip; `open_run` calls it before any server starts."""
        renderer = Renderer(
            tokenizer, [t.schema() for t in env_cls.tools], cfg.template_kwargs, cfg.end_of_turn
        )
        if not env_cls.tools and issubclass(env_cls, ToolEnv) and env_cls not in _TOOL_LESS:
            _TOOL_LESS.add(env_cls)  # prepare runs at start-up and again for the rollout: once
            log.warning(
                "%s is a ToolEnv with no tools (`tools = []`): the model is offered none, so no "
                "turn can call one. List its tools, or subclass Env for a tool-less env",
                env_cls.__name__,
            )
        if env_cls.tools or issubclass(env_cls, AgentEnv):  # an agent brings its own tools
            # the parser holds a turn to as many calls as the template can write (Llama 3.x: 1)
            parser = resolve_parser(cfg.parser, tokenizer, template_max_calls(renderer.render))
            check_template(parser, tokenizer)
            check_round_trip(renderer, parser)
        else:
            parser = get_parser("hermes" if cfg.parser == "auto" else cfg.parser)
        check_summary_history(renderer, cfg.context)
        return renderer, parser

    # -- public --------------------------------------------------------------------------------

    async def run(self, tasks: list[Task], keep: int | None = None) -> list[list[Trajectory]]:
        """Every task's group, in task order. With `keep` < len(tasks) (over-sampling), only
        the first `keep` groups to finish come back (still in task order); the others are
        cancelled at once: their in-flight generations are aborted on the engine
        (/abort_request) and their envs closed."""
        return await run_groups(self.run_group, tasks, keep)

    async def run_group(self, task: Task, n: int | None = None) -> list[Trajectory]:
        n = n or self.cfg.group_size
        slot = group_slot(task.id)  # trainer.deterministic: the seeds' place (agentrl/seeding.py)
        # an agent's episode, or one under rollout.thinking=template, may leave several sequences
        run = self.agents.run_episode if self.agents is not None else self.run_sequences
        return [t for ep in await gather_all(run(task, i, slot) for i in range(n)) for t in ep]

    async def run_episode(self, task: Task, sample_index: int = 0, slot: int = 0) -> Trajectory:
        """One episode of `task`: its trajectory (with rollout.thinking=template, its last
        sequence, scored for the whole episode; `run_sequences` gives them all)."""
        return (await self.run_sequences(task, sample_index, slot))[-1]

    async def run_sequences(
        self, task: Task, sample_index: int = 0, slot: int = 0
    ) -> list[Trajectory]:
        """One episode of `task` as its training sequences (one unless rollout.thinking=template
        forked it; they share `metadata["session"]`, so the group baseline counts the episode
        once, and its reward). `slot` (the task's n-th group of a seeded round) only enters its
        requests' sampling seeds (trainer.deterministic; agentrl/seeding.py)."""
        session = f"{task.id}:{sample_index}:{uuid.uuid4().hex[:8]}"
        seeds = episode_key(task.id, slot, sample_index)
        ctx = ToolContext(session, self.sandbox, self.cfg.tool_timeout_s, task=task)
        seqs = [TokenSequence()]
        stop, error, env = StopReason.ABORTED, None, None
        t0 = time.monotonic()
        try:
            env = self.env_cls(task, ctx, **self.env_kwargs)
            # in this task: 3.11's wait_for lost a cancel that came as the loop ended (tool.py)
            async with asyncio.timeout(self.cfg.episode_timeout_s):  # sys.exit: the env's fault
                stop = await no_exit(self._loop(env, seqs, session, seeds))
        except SandboxUnavailable as e:
            stop, error = StopReason.SANDBOX_UNAVAILABLE, f"{type(e).__name__}: {e}"
        except EnvStepError as e:
            warn_episode(log, session, f"env step raised: {e.args[0].strip().splitlines()[-1]}")
            stop, error = StopReason.ENV_ERROR, e.args[0]
        except PromptOverflow as e:  # so would every episode of the task: the guards warn
            stop, error = StopReason.CONTEXT_OVERFLOW, f"task {task.id!r}: {e}"
        except TimeoutError:
            tool_s = sum(t.tool_latency_s for q in seqs for t in q.turns)
            stop = StopReason.of_timeout(tool_s, time.monotonic() - t0)
            error = (f"episode exceeded rollout.episode_timeout_s={self.cfg.episode_timeout_s:g} "
                     f"({tool_s:.1f} s of it in its tool calls)")  # fmt: skip
        except EngineUnavailable as e:  # infrastructure, not the env: no traceback, re-issued
            error = f"{ENGINE_DOWN}: {e}"
        except asyncio.CancelledError:  # over-sampling dropped this group: close, then go
            if env is not None:
                with contextlib.suppress(Exception):
                    await env.close()
            self._release(session)
            raise
        except (RenderError, ConfigError):
            raise  # the template or the config cannot work: a bug to stop on, not an episode
        except Exception as e:  # the episode boundary: one failure becomes one reason
            warn_episode(log, session, f"aborted: {type(e).__name__}: {e}")
            error = traceback.format_exc()
        if len(seqs) > 1 and not seqs[-1].turns:  # forked, then ended before sampling on it
            seqs.pop()
        meta = {"session": session, **_reference(task)}
        trajs = [
            s.trajectory(task.id, sample_index, stop, error,
                         {**meta, **({"sequence": k} if len(seqs) > 1 else {})})
            for k, s in enumerate(seqs)
        ]  # fmt: skip
        last = trajs[-1]  # its messages are the whole episode's: the env scores it
        if env is not None:
            await finish_episode(env, last)
        self._release(session)
        for t in trajs:
            t.stop_reason, t.error, t.reward = last.stop_reason, last.error, last.reward
            t.reward_components = dict(last.reward_components)
            t.metadata["episode_s"] = time.monotonic() - t0
        return trajs

    def _release(self, session: str) -> None:  # the engine client forgets the episode's server
        if (release := getattr(self.engine, "release", None)) is not None:
            release(session)

    # -- internals -----------------------------------------------------------------------------

    async def _loop(
        self, env: Env, seqs: list[TokenSequence], session: str, seeds: str | None
    ) -> StopReason:
        cfg, r, st = self.cfg, self.renderer, seqs[-1]
        st.messages = checked_messages(await env.start(), f"{type(env).__name__}.start()")
        head = len(st.messages)  # a summary keeps them (rollout.context)
        st.append(r.prompt_ids(st.messages, memo=True), None)  # a group's samples share it
        st.prompt_len = len(st.ids)
        if st.prompt_len >= cfg.max_context_tokens:  # not one token of a turn fits
            raise PromptOverflow(f"its first prompt is {st.prompt_len} tokens, "
                                 f"rollout.max_context_tokens={cfg.max_context_tokens}")  # fmt: skip
        max_turns = cfg.max_turns or env.max_turns
        for index in range(max_turns):
            budget = cfg.max_context_tokens - len(st.ids)
            if budget <= 0:
                return StopReason.CONTEXT_OVERFLOW
            try:
                params = self._params(budget, turn_seed(seeds, index))
                comp = await self.engine.generate(st.ids, params, key=session)
            except PromptTooLong as e:  # the server's context is shorter than max_context_tokens
                if index == 0:
                    raise PromptOverflow(f"the server refused its first prompt: {e}") from None
                return StopReason.CONTEXT_OVERFLOW
            turn, said = self._record_turn(st, comp, index)
            if comp.finish_reason is FinishReason.ABORT:
                return StopReason.ABORTED
            if comp.finish_reason is FinishReason.LENGTH:
                if budget < cfg.max_new_tokens:  # cut by the context budget
                    return StopReason.CONTEXT_OVERFLOW
                if not cfg.ignore_eos:  # with ignore_eos every turn ends at the limit: go on
                    return StopReason.LENGTH
            result = await take_step(env, said, turn)
            if isinstance(result, StopReason):
                return result
            if result.done:
                return result.stop_reason or StopReason.COMPLETED
            obs = [self._truncate(m, turn) for m in result.messages]
            if index == max_turns - 1:  # the last turn's results are kept, never rendered
                turn.observations = obs
                st.messages += obs
                break
            obs, obs_ids = self._observation(obs, comp.token_ids, turn)
            turn.observations = obs
            st.messages += obs
            ask = partial(
                self._summary, env, st, obs, comp, turn, session, turn_seed(seeds, ~index), head
            )
            try:
                nxt = await self._continue(env, seqs, st, obs_ids, ask)
            except Unrenderable:  # the history holds a turn of the model's the template refuses
                turn.num_parse_errors += 1
                return StopReason.PARSE_ERROR
            if isinstance(nxt, StopReason):
                return nxt
            st = nxt
        return StopReason.MAX_TURNS

    async def _continue(
        self,
        env: Env,
        seqs: list[TokenSequence],
        st: TokenSequence,
        obs_ids: list[int],
        ask: Callable[[], Awaitable[list[Message] | StopReason]],
    ) -> TokenSequence | StopReason:
        """The sequence the next turn samples on: `st` with the observation's ids after its last
        turn, or a new one over another prompt (mask 0), when the template renders the history
        otherwise (rollout.thinking=template) or the history is rewritten to fit (rollout.context,
        agentrl/context.py). A StopReason: the episode ends (context_overflow: the next prompt
        does not fit max_context_tokens; aborted: the engine aborted the summary request)."""
        cfg, r = self.cfg, self.renderer
        ids, messages, before = None, None, 0  # ids None: st's and the observation's, as they are
        if cfg.thinking == "template" and (fresh := r.history_ids(st.messages)) != st.ids + obs_ids:
            ids, messages = fresh, st.messages
        size = len(st.ids) + len(obs_ids) if ids is None else len(ids)  # counted, not copied
        full = cfg.context.compact_at * cfg.max_context_tokens
        if cfg.context.policy != "none" and size > full:
            if cfg.context.policy == "summarize":
                said = await ask()
                if isinstance(said, StopReason):  # not even the question fits, or aborted
                    return said
                new = said, r.history_ids(said)
            else:
                new = await rewritten(cfg.context, env, st.messages, r, size)
            if new is not None:
                before, (messages, ids) = size, new
                still_full(cfg.context, len(ids), full)
        if (size if ids is None else len(ids)) >= cfg.max_context_tokens:
            return StopReason.CONTEXT_OVERFLOW
        if messages is None:
            st.append(obs_ids, None)
            st.turns[-1].obs_end = len(st.ids)
            return st
        seqs.append(nxt := TokenSequence(prompt_len=len(ids), messages=list(messages)))
        nxt.append(ids, None)
        nxt.rewrite = (before, len(ids)) if before else None
        return nxt

    async def _summary(
        self, env: Env, st: TokenSequence, obs: list[Message], comp: Completion, turn: Turn,
        session: str, seed: int | None, head: int,
    ) -> list[Message] | StopReason:  # fmt: skip
        """rollout.context.policy=summarize: after the turn's results, ask for a summary, sampled
        on `st` (a turn of its own, trained there); the history goes on from the env's `head`
        start messages + it + the last keep_turns turns (agentrl/context.py). context_overflow:
        not even the question and one token fit; aborted: the engine aborted the request."""
        c, r = self.cfg, self.renderer
        before = list(st.messages)
        q = Message(
            role="user", content=getattr(env, "summary_prompt", None) or c.context.summary_prompt
        )
        try:
            ids = r.observation_ids([*obs, q], comp.token_ids, turn.assistant)
        except Exception as e:  # the template refuses the model's turn: its parse error
            raise Unrenderable(f"{type(e).__name__}: {e}") from e
        budget = c.max_context_tokens - len(st.ids) - len(ids)
        if budget <= 0:
            return StopReason.CONTEXT_OVERFLOW
        st.append(ids, None)
        turn.obs_end = len(st.ids)
        st.messages.append(q)
        try:
            said = await self.engine.generate(st.ids, self._params(budget, seed), key=session)
        except PromptTooLong:  # the server's context is shorter: an overflow, as in _loop
            return StopReason.CONTEXT_OVERFLOW
        _, summary = self._record_turn(st, said, len(st.turns))
        if said.finish_reason is FinishReason.ABORT:  # no summary of the model's: as in _loop
            return StopReason.ABORTED
        return summarized(before, summary.message.content, c.context.keep_turns, head)

    def _params(self, budget: int, seed: int | None = None) -> SamplingParams:
        c = self.cfg
        return SamplingParams(
            seed=seed,
            max_new_tokens=min(c.max_new_tokens, budget),
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            ignore_eos=c.ignore_eos,
            stop_token_ids=self.renderer.stop_ids,  # rollout.end_of_turn, GLM-4.5's tags too
        )

    def _record_turn(
        self, st: TokenSequence, comp: Completion, index: int
    ) -> tuple[Turn, AssistantTurn]:
        return record_turn(st, comp, self.renderer, self.parser, self.tool_args, index)

    def _observation(
        self, obs: list[Message], sampled: list[int], turn: Turn
    ) -> tuple[list[Message], list[int]]:
        """(the observation, its ids after the sampled turn). A chat template that cannot render
        the turn the model sampled is the model's doing, never an infrastructure abort: the model
        reads why in place of the results, and the turn counts a parse error. A template that
        cannot render even that is a RenderError: the run stops (a configuration problem)."""
        try:
            return obs, self.renderer.observation_ids(obs, sampled, turn.assistant)
        except Exception as e:  # jinja2's raise_exception, RenderError, TypeError, …
            why = f"{type(e).__name__}: {e}"
        note = Message(
            role="tool",
            content=f"Error: this model's chat template cannot write your last turn ({why}); "
            "its tool results are not shown. Write tool calls the way the template does",
        )
        try:
            ids = self.renderer.observation_ids([note], sampled)
        except Exception as e:
            raise RenderError(f"the chat template cannot render an error observation: {e}") from e
        turn.num_parse_errors += 1
        return [note], ids

    def _truncate(self, msg: Message, turn: Turn) -> Message:
        content, cut = self.renderer.truncate(msg.content, self.cfg.max_obs_tokens)
        if not cut:
            return msg
        turn.truncated_obs_tokens += cut
        return msg.model_copy(update={"content": content})


def generation_defaults(cfg: RolloutConfig, renderer: Renderer) -> GenerationDefaults:
    """What a gateway samples with: the rollout's own settings (`rollout.*`)."""
    return GenerationDefaults(
        max_new_tokens=cfg.max_new_tokens,
        max_context_tokens=cfg.max_context_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        stop_token_ids=renderer.stop_ids,
        ignore_eos=cfg.ignore_eos,
        template_kwargs=cfg.template_kwargs,
        end_of_turn=cfg.end_of_turn,
        thinking=cfg.thinking,
    )

"""The gateway: an OpenAI-compatible HTTP server in the run's own process and event loop, in
front of the run's engines (the same client, router pinning, weight gate and partial rollouts
as every rollout). An agent written with any framework points its OpenAI client here with its
episode's key; each chat completion is rendered with the model's chat template, sampled, parsed
with the run's tool-call parser and recorded token-exact (agentrl/gateway/capture.py).

    gw = Gateway(engine, tokenizer, GatewayConfig(), GenerationDefaults(...))
    url = await gw.start()                       # http://127.0.0.1:<port>/v1
    ep = gw.open("task-1", 0, session, seeds)    # ep.key: the agent's api_key
    ... the agent calls POST {url}/chat/completions with Authorization: Bearer <ep.key> ...
    gw.close(ep)                                 # later requests with that key: 401
    await gw.aclose()

Routes: POST /v1/chat/completions (JSON or `stream: true` server-sent events), POST
/v1/responses (the Responses API, non-streaming: agentrl/gateway/responses.py), GET /v1/models,
and the same under /episodes/<key>/v1/ for clients that cannot set a key. Errors are OpenAI
error bodies: 401 unknown or finished episode, 400 a request the gateway cannot serve (it says
why; counted as gateway/bad_requests) or a budget spent (the episode's outcome is then set:
max_turns for rollout.gateway.max_requests, length for max_sampled_tokens, context_overflow for
rollout.max_context_tokens), 503 no engine answered (the episode is then an infrastructure
failure, left out of the baseline).

Streaming sends the whole answer as chunks once it is sampled (role, content, each tool call,
finish reason, usage when `stream_options.include_usage`), then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agentrl.engine import (
    EngineProtocolError,
    EngineRequestError,
    EngineUnavailable,
    PromptTooLong,
    SamplingParams,
)
from agentrl.gateway.answer import deliver, unseen
from agentrl.gateway.capture import Captured, EpisodeCapture, Plan
from agentrl.gateway.config import GatewayConfig
from agentrl.gateway.limits import Parts, body_limit, chat_parts, responses_parts, tokens_past
from agentrl.gateway.responses import parse_responses_request, response_body
from agentrl.gateway.sampling import (
    GenerationDefaults,
    refuse_in_run,
    refuse_other_template,
    sampling_params,
)
from agentrl.gateway.stop import CallCutError, cut_at_stop, cut_to_one_call
from agentrl.gateway.wire import (
    ChatRequest,
    Choice,
    WireError,
    bad,
    completion_body,
    finish_of,
    new_id,
    parse_request,
    stream_chunks,
)
from agentrl.parsers import Parser
from agentrl.parsers.base import split_reasoning
from agentrl.render import Renderer, RenderError
from agentrl.seeding import turn_seed
from agentrl.sequence import record_turn
from agentrl.tool import gather_all
from agentrl.types import Completion, FinishReason, Message, StopReason

log = logging.getLogger(__name__)


def _overflow(ep: EpisodeCapture, why: str, said: str | None = None) -> WireError:
    """The episode overflows its context (`why`, its error) and the agent reads so (`said`, else
    `why`) as OpenAI's context_length_exceeded: one rule for every way a request can be too long."""
    ep.flag(StopReason.CONTEXT_OVERFLOW, why)
    return bad(said or why, "context_length_exceeded")


def _engine_failed(ep: EpisodeCapture, e: Exception) -> WireError:
    """What the agent reads, and how its episode ends, when the engine did not sample: a prompt
    past the model's context is the episode's context_overflow (a 400, as OpenAI's); no server
    answering (503), or one refusing for another reason (502: the run's sampling settings or
    the engine, not the agent's request), is the system's failure, `aborted`."""
    if isinstance(e, PromptTooLong):
        return _overflow(ep, str(e), f"the prompt is longer than the engine's context: {e}")
    ep.flag(StopReason.ABORTED, f"{type(e).__name__}: {e}")
    if isinstance(e, EngineUnavailable):
        return WireError(503, "engine_unavailable", f"no rollout server answered: {e}")
    return WireError(502, "engine_error", f"the rollout server refused: {e}")


def _as_text(msg: Message, text: str) -> None:
    """A request that offered no tool (or said tool_choice none) is answered text, as OpenAI
    answers it: a tool call the model wrote anyway stays in the content, never a `tool_calls`
    entry an agent without tools cannot run. The sampled ids are recorded as they were."""
    thought, rest = split_reasoning(text)  # the reasoning stays apart, as the parser set it
    msg.content, msg.tool_calls = (rest.strip() if thought is not None else text), []


class Gateway:
    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        parser: Parser,
        cfg: GatewayConfig | None = None,
        defaults: GenerationDefaults | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.parser = engine, tokenizer, parser
        self.cfg = cfg or GatewayConfig()
        self.defaults = defaults or GenerationDefaults()
        self.episodes: dict[str, EpisodeCapture] = {}
        self._renderers: dict[str, Renderer] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, routes: Callable[[web.Application], None] | None = None) -> str:
        """Listen (rollout.gateway.host/port); returns the base URL agents use (…/v1).
        `routes` adds more to the app (the standalone command's admin routes)."""
        if self._runner is not None:
            return self.url
        app = web.Application(client_max_size=body_limit(self.defaults.max_context_tokens))
        if routes is not None:
            routes(app)
        for prefix in ("/v1", "/episodes/{key}/v1"):
            app.router.add_post(prefix + "/chat/completions", self._chat)
            app.router.add_post(prefix + "/responses", self._responses)
            app.router.add_get(prefix + "/models", self._models)
        # an agent that goes away (its episode cancelled: over-sampling, a stop) cancels its
        # request here, and so the generation on the engine (aborted there)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self.cfg.host, self.cfg.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self.cfg.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("the gateway listens on %s:%d, beyond this host: each episode's key is "
                        "its only guard, and it is sent in clear HTTP", self.cfg.host, port)  # fmt: skip
        self._runner, self.url = runner, f"http://{self.cfg.host}:{port}/v1"
        return self.url

    async def aclose(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def open(
        self, task_id: str, sample_index: int, session: str, seeds: str | None = None
    ) -> EpisodeCapture:
        ep = EpisodeCapture(task_id, sample_index, session, seeds)
        self.episodes[ep.key] = ep
        return ep

    def close(self, ep: EpisodeCapture) -> EpisodeCapture:
        """The episode is over: its key is refused from now on, its sequences are final."""
        ep.closed = True
        self.episodes.pop(ep.key, None)
        for task in list(ep.inflight):  # its requests still sampling: cancelled, not recorded
            task.cancel()
        return ep

    # -- HTTP ----------------------------------------------------------------------------------

    def _episode(self, request: web.Request) -> EpisodeCapture:
        key = request.match_info.get("key")
        if key is None:
            auth = request.headers.get("Authorization", "")
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        ep = self.episodes.get(key)
        if ep is None:
            raise WireError(
                401,
                "invalid_api_key",
                "unknown or finished episode key: each "
                "episode's agent uses the key its AgentEnv.run was given",
            )
        return ep

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._episode(request)
        except WireError as e:
            return web.json_response(e.body(), status=e.status)
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "agentrl", "object": "model", "created": 0, "owned_by": "agentrl"}],
            }
        )

    async def _serve(
        self,
        request: web.Request,
        parse: Callable[[Any], ChatRequest],
        parts: Callable[[Any, int], Parts],
    ) -> tuple[EpisodeCapture, ChatRequest, list[Choice], dict[str, int]] | web.Response:
        """Attribute, read (`parse`: body → ChatRequest, once its `parts` are within the
        context: agentrl/gateway/limits.py) and complete one request; a refusal is the OpenAI
        error response (a 400 counted as the episode's bad request)."""
        ep: EpisodeCapture | None = None
        try:
            ep = self._episode(request)
            try:
                body = await request.json(loads=json.loads)
            except (ValueError, RecursionError, LookupError) as e:  # bad JSON, UTF-8 or charset,
                # nesting past Python's recursion limit, an integer of over 4300 digits
                raise bad(f"the request body is not JSON: {type(e).__name__}: {e}") from e
            except web.HTTPRequestEntityTooLarge as e:  # past body_limit: no history that fits
                raise self._too_large(ep, request.content_length or e.max_size) from None
            self._admit(ep)
            limit = self.defaults.max_context_tokens
            if (held := parts(body, limit)).total > limit:
                raise _overflow(ep, held.why(limit))
            req = parse(body)
            choices, usage = await self.complete(ep, req)
        except WireError as e:
            if ep is not None and e.status == 400:
                ep.counts["bad_requests"] += 1
            return web.json_response(e.body(), status=e.status)
        return ep, req, choices, usage

    def _too_large(self, ep: EpisodeCapture, size: int) -> WireError:
        """A body past `body_limit`: the episode overflows its context, as a prompt past
        rollout.max_context_tokens does, and the agent reads why (OpenAI's error body)."""
        tokens = self.defaults.max_context_tokens
        limit = body_limit(tokens)
        why = (f"the request body is over {limit} bytes ({size} sent), more than any history "
               f"of rollout.max_context_tokens={tokens} tokens can take; it was not read")  # fmt: skip
        return _overflow(ep, why)

    async def _responses(self, request: web.Request) -> web.Response:
        served = await self._serve(request, parse_responses_request, responses_parts)
        if isinstance(served, web.Response):
            return served
        ep, req, choices, usage = served
        return await deliver(request, ep, [response_body(req, choices[0], usage)])

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        served = await self._serve(request, parse_request, chat_parts)
        if isinstance(served, web.Response):
            return served
        ep, req, choices, usage = served
        rid = new_id()
        if not req.stream:
            return await deliver(request, ep, [completion_body(rid, req.model, choices, usage)])
        chunks = stream_chunks(rid, req.model, choices, usage if req.include_usage else None)
        return await deliver(request, ep, list(chunks), stream=True)

    # -- one request ---------------------------------------------------------------------------

    def _admit(self, ep: EpisodeCapture) -> None:
        """Refuse a request of an episode that is over."""
        if ep.closed:  # it ended while the body was read: nothing is sampled for it
            raise WireError(401, "episode_over", "the episode ended during this request")
        if ep.stop is not None:
            raise bad(f"this episode is over ({ep.stop.value}): {ep.error}", "episode_over")

    async def complete(
        self, ep: EpisodeCapture, req: ChatRequest
    ) -> tuple[list[Choice], dict[str, int]]:
        """Serve one request of `ep`: `req.n` samples of its messages, recorded."""
        self._admit(ep)
        if self.cfg.sampling == "run":  # refused before it counts against the budgets
            refuse_in_run(req.sampling, self.defaults)
        refuse_other_template(req.template, self.defaults)
        if ep.requests + req.n > self.cfg.max_requests:
            ep.flag(
                StopReason.MAX_TURNS, f"past rollout.gateway.max_requests={self.cfg.max_requests}"
            )
            raise bad(
                f"this episode made rollout.gateway.max_requests={self.cfg.max_requests} "
                "requests; no more are served",
                "episode_budget_exceeded",
            )
        ep.requests += req.n  # each sample counts against rollout.gateway.max_requests
        own = req.sampling.temperature, req.sampling.top_p
        if self.cfg.sampling == "run" and own != (None, None):
            ep.counts["sampling_overridden"] += 1
        limit = self.defaults.max_context_tokens
        plain = self._renderer([])[0]  # the tools' text is counted before it is rendered
        if (past := tokens_past(plain, req.messages, limit, req.tools)) is not None:
            why = (f"the messages and tools hold {past}+ tokens of text, past "
                   f"rollout.max_context_tokens={limit}")  # fmt: skip
            raise _overflow(ep, why)
        renderer, key = self._renderer(req.tools)
        plan = self._plan(ep, req, renderer, key)  # once: the n samples read the same ids
        ps = [plan] + [ep.again(plan) for _ in range(1, req.n)]
        index = ep.requests - req.n
        task = asyncio.current_task()
        assert task is not None
        ep.inflight.add(task)  # cancelled when the episode closes (Gateway.close)
        recorded: list[Captured] = []
        try:
            results = await gather_all(
                [self._sample(ep, req, renderer, p, index, i, recorded) for i, p in enumerate(ps)]
            )
        except BaseException:
            if recorded and not ep.closed:  # a sibling failed or the agent went away
                unseen(ep, f"{len(recorded)} of the request's {req.n} samples were recorded")
            raise
        finally:
            ep.inflight.discard(task)
        ep.answered([r[3] for r in results])  # choices[0]'s is the episode's latest answer
        prompt = results[0][1]
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": sum(r[2] for r in results),
            "total_tokens": prompt + sum(r[2] for r in results),
        }
        return [r[0] for r in results], usage

    def _plan(self, ep: EpisodeCapture, req: ChatRequest, renderer: Renderer, key: str) -> Plan:
        try:
            return ep.plan(req.messages, key, renderer, self.defaults.thinking == "template")
        except RenderError as e:
            raise bad(f"the model's chat template cannot render these messages: {e}") from e
        except Exception as e:  # jinja2's raise_exception, TypeError, … from the template
            raise bad(
                f"the model's chat template refused these messages: {type(e).__name__}: {e}"
            ) from e

    async def _sample(
        self,
        ep: EpisodeCapture,
        req: ChatRequest,
        renderer: Renderer,
        plan: Plan,
        index: int,
        i: int,
        recorded: list[Captured],
    ) -> tuple[Choice, int, int, Captured]:
        params = self._params(ep, req, plan, index, i)
        cap = ep.commit(plan)
        ep.reserved += params.max_new_tokens  # until sampled: the episode's budget holds
        try:
            comp = await self.engine.generate(cap.seq.ids, params, key=ep.session)
            if ep.closed:  # the episode ended while this was sampling: nothing is recorded
                raise WireError(401, "episode_over", "the episode ended during this request")
            comp, cut = self._end(req, comp, renderer, len(cap.seq.ids))
            turn, said = record_turn(cap.seq, comp, renderer, self.parser, None,
                                     len(cap.seq.turns))  # fmt: skip
        except (EngineRequestError, EngineProtocolError, EngineUnavailable) as e:
            ep.undo(cap, plan)
            raise _engine_failed(ep, e) from e
        except CallCutError as e:  # loud: two calls answered would break the request's flag
            ep.undo(cap, plan)
            ep.flag(StopReason.ABORTED, str(e))
            raise WireError(500, "tool_call_cut", str(e), "parallel_tool_calls") from e
        except BaseException:
            ep.undo(cap, plan)
            raise
        finally:
            ep.reserved -= params.max_new_tokens
        if said.message.tool_calls and (req.no_calls or not req.tools):  # none offered
            _as_text(said.message, turn.text)
        if cut is not None:  # OpenAI leaves the stop text out of the content
            said.message.content = said.message.content.split(cut, 1)[0]
        turn.num_tool_calls = len(said.message.tool_calls)  # well-formed: the agent runs them
        for call in said.message.tool_calls:  # ids unique in the episode (agents key calls by id)
            call.id = ep.call_id()
        ep.sampled(cap, turn)
        recorded.append(cap)
        if comp.finish_reason is FinishReason.ABORT:
            ep.flag(StopReason.ABORTED, "the engine aborted the request")
        for e in said.parse_errors:
            ep.counts["parse_errors"] += 1
            log.debug("episode %s: %s", ep.session, e.message)
        return (
            Choice(said.message, finish_of(said.message, comp.finish_reason)),
            plan.length,
            (turn.end - turn.start),
            cap,
        )

    def _end(
        self, req: ChatRequest, comp: Completion, renderer: Renderer, prompt_len: int
    ) -> tuple[Completion, str | None]:
        """Where the answer ends: at the request's first stop string, then, under
        parallel_tool_calls false, after its first tool call; and the stop string that ended
        it (None: the engine's own end, or the first call, ended it)."""
        comp, cut = cut_at_stop(comp, req.stop, renderer, prompt_len)
        if req.parallel_calls or req.no_calls or not req.tools:  # calls answered as text: all
            return comp, cut
        one = cut_to_one_call(comp, renderer, self.parser, prompt_len)
        return (comp, cut) if one is None else (one, None)

    def _params(
        self, ep: EpisodeCapture, req: ChatRequest, plan: Plan, index: int, i: int
    ) -> SamplingParams:
        """Sample `i` of the episode's request `index`: its sampling params, within budgets."""
        d = self.defaults
        room = d.max_context_tokens - plan.length
        if room <= 0:
            raise _overflow(
                ep,
                f"{plan.length} prompt ids, rollout.max_context_tokens={d.max_context_tokens}",
                f"this request's prompt is {plan.length} tokens, at or past "
                f"rollout.max_context_tokens={d.max_context_tokens}",
            )
        left = self.cfg.max_sampled_tokens - ep.sampled_tokens - ep.reserved
        if left <= 0:
            ep.flag(
                StopReason.LENGTH,
                f"past rollout.gateway.max_sampled_tokens={self.cfg.max_sampled_tokens}",
            )
            raise bad(
                f"this episode sampled, or is sampling, rollout.gateway.max_sampled_tokens="
                f"{self.cfg.max_sampled_tokens} tokens; no more are served",
                "episode_budget_exceeded",
            )
        most = min(d.max_new_tokens, req.max_tokens or d.max_new_tokens, room, left)
        own = self.cfg.sampling == "request"
        return sampling_params(req.sampling, own, d, most, turn_seed(ep.seeds, index + i), i)

    def _renderer(self, tools: list[dict[str, Any]]) -> tuple[Renderer, str]:
        key = json.dumps(tools, sort_keys=True)
        r = self._renderers.pop(key, None)
        if r is None:
            d = self.defaults
            try:
                r = Renderer(self.tokenizer, tools, d.template_kwargs, d.end_of_turn)
            except Exception as e:
                raise bad(
                    f"the model's chat template cannot render these tools: {type(e).__name__}: {e}"
                ) from e
        self._renderers[key] = r  # the most recent last; the least recent go past 32
        while len(self._renderers) > 32:
            del self._renderers[next(iter(self._renderers))]
        return r, key

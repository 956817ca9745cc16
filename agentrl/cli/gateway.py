"""`agentrl gateway …`: the gateway on its own, for agents you run by hand — point your agent
at it, see what the policy answers and how each request was captured, without training.

    agentrl gateway                                   # the shipped tiny model on the dev server
    agentrl gateway model=local model.path=DIR engine.kind=sglang          # a real model, SGLang
    agentrl gateway engine.urls=[http://127.0.0.1:30000] model.path=DIR    # servers you run

It prints the base URL and an admin token. Each episode is opened and closed with the token:

    POST /admin/episodes                  -> {"key": …, "base_url": …}   (your agent's api_key)
    POST /admin/episodes/<key>/close      {"reward": 1.0} (optional) -> the episode's sequences

Closing writes the episode's training sequences, token-exact, to
runs/<run_name>/gateway/<date>_<time>/trajectories.jsonl (`agentrl view` reads it), with the
capture counts (start, extend, branch, fork) in each first sequence's metadata. Sampling and
budgets are the run's (`rollout.*`, `rollout.gateway.*`). Stop with Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from pathlib import Path
from typing import Any

import hydra
from aiohttp import web
from hydra.core.hydra_config import HydraConfig
from transformers import AutoTokenizer

from agentrl.agent_env import AgentEnv
from agentrl.agent_rollout import episode_trajectories
from agentrl.cli.logs import quiet_third_party
from agentrl.config import CONFIG_DIR, Config, check_command_line, errors_for_people, load_config
from agentrl.engine import EngineClient, launch_fleet
from agentrl.gateway import EpisodeCapture, Gateway
from agentrl.rollout import Rollout, generation_defaults
from agentrl.types import StopReason


class Standalone:
    """A gateway with admin routes to open and close episodes by hand."""

    def __init__(self, gateway: Gateway, out: Path) -> None:
        self.gateway, self.out = gateway, out
        self.token = "agentrl-admin-" + secrets.token_urlsafe(24)
        self.episodes = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/admin/episodes", self._open)
        app.router.add_post("/admin/episodes/{key}/close", self._close)

    def _authorized(self, request: web.Request) -> bool:
        return secrets.compare_digest(request.headers.get("Authorization", ""),
                                      f"Bearer {self.token}")  # fmt: skip

    async def _open(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "admin token required"}, status=401)
        self.episodes += 1
        ep = self.gateway.open(f"manual-{self.episodes}", 0, f"manual-{self.episodes}")
        return web.json_response({"key": ep.key, "base_url": self.gateway.url})

    async def _close(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "admin token required"}, status=401)
        ep: EpisodeCapture | None = self.gateway.episodes.get(request.match_info["key"])
        if ep is None:
            return web.json_response({"error": "unknown or closed episode"}, status=404)
        body: Any = {}
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError as e:  # bad JSON: said, and the episode stays open
                return web.json_response({"error": f"the body is not JSON: {e}"}, status=400)
        reward = body.get("reward", 0.0) if isinstance(body, dict) else 0.0
        if (
            isinstance(reward, bool)
            or not isinstance(reward, int | float)
            or not math.isfinite(reward)
        ):
            return web.json_response({"error": f"reward must be a finite number, got {reward!r}"},
                                     status=400)  # fmt: skip
        self.gateway.close(ep)
        trajs = episode_trajectories(ep, ep.stop or StopReason.COMPLETED, ep.error)
        for t in trajs:
            t.reward = float(reward)
        self.out.mkdir(parents=True, exist_ok=True)
        with (self.out / "trajectories.jsonl").open("a") as f:
            for t in trajs:
                f.write(t.to_json() + "\n")
        return web.json_response({
            "sequences": [{"origin": t.metadata.get("origin"), "turns": len(t.turns),
                           "sampled_tokens": t.num_sampled, "stop_reason": t.stop_reason.value}
                          for t in trajs],
            "gateway": trajs[0].metadata.get("gateway", {}),
        })  # fmt: skip


async def serve(cfg: Config, out: Path, started: asyncio.Future | None = None) -> None:
    """Start the engines `cfg` asks for and the gateway in front of them; run until cancelled.
    `started` (tests) gets the Standalone once it listens."""
    model_path = cfg.model.resolve()
    tok = AutoTokenizer.from_pretrained(cfg.model.tokenizer or model_path)
    renderer, parser = Rollout.prepare(tok, AgentEnv, cfg.rollout)
    r = cfg.rollout
    defaults = generation_defaults(r, renderer)
    with launch_fleet(cfg.engine, model_path, out) as fleet:
        engine = EngineClient.from_config(cfg.engine.model_copy(update={"urls": fleet.urls}))
        gw = Gateway(engine, tok, parser, r.gateway, defaults)
        app = Standalone(gw, out)
        try:
            await engine.control.wait_healthy(cfg.engine.health_timeout_s)
            await gw.start(app.routes)
            if started is not None:
                started.set_result(app)
            else:
                print(f"gateway: {gw.url}\nadmin token: {app.token}\n"
                      f"open an episode:  curl -X POST -H 'Authorization: Bearer {app.token}' "
                      f"{gw.url.removesuffix('/v1')}/admin/episodes\n"
                      f"episodes are written to {out / 'trajectories.jsonl'}; Ctrl-C stops",
                      flush=True)  # fmt: skip
            await asyncio.Event().wait()
        finally:
            await gw.aclose()
            await engine.aclose()


def session_dir(run_dir: Path, when: float | None = None) -> Path:
    """Where one `agentrl gateway` session (started at `when`, default now) writes its episodes:
    <run dir>/gateway/<date>_<time>/ (`agentrl view <run dir>` reads the newest session's)."""
    return run_dir / "gateway" / time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(when))


def main() -> None:
    @hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
    def _run(raw: Any) -> None:
        quiet_third_party()
        out = session_dir(Path(HydraConfig.get().runtime.output_dir))
        with errors_for_people(), contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(load_config(raw), out))

    check_command_line()
    _run()


if __name__ == "__main__":
    main()

"""The hand-over between the learner and the rollout servers, written once, in the order it runs:
to the learner (colocated: the servers release their GPU memory, the learners move back onto it),
the push (weights first, then under `EngineClient.exclusive`, then back to the engines), and the
restarts of servers that died or hung.

Colocated (`engine.colocate=true`) a step goes:
    to_learner(): engine.control.release_memory_occupation → learners onload
    push():       engine.control.resume_memory_occupation(weights) → exclusive → sync.push
                  → to_engine(): learners offload → engine.control.resume_memory_occupation(kv, graphs)
Otherwise only the push under `exclusive` does anything.

Restarts (this run's servers only; servers given by `engine.urls` stop the run with their names):
- after a rollout (`recover`): the dead servers are restarted on their ports
  (`engine.max_restarts` each) and get the current weights through a hand-over and a push; the
  groups that lost an episode are rolled out again by the group source (agentrl/groups.py);
- while the learner scores and updates (`revive_before_push`): the dead servers are restarted so
  the step's own push reaches them. Colocated, the learner leaves the GPU while they start and
  each new server releases its memory before the learner comes back, so the push finds every
  server in the same state;
- during a push itself: not recoverable in place (a collective with a dead member blocks until
  its timeout); the run stops with the error and resumes from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from agentrl.engine import EngineClient, EngineConfig, EngineUnavailable
from agentrl.types import TrainingError

if TYPE_CHECKING:  # annotations only: the parts come built (agentrl/run.py); no Ray to import
    from agentrl.engine import Fleet
    from agentrl.learner.group import LearnerGroup
    from agentrl.weight_sync import Transport

log = logging.getLogger(__name__)


class Handover:
    """Weights and GPU memory between the learner groups and the engines (module docstring).
    `fleet`: the servers this run started (None or not `owned`: none to restart); `cut`: a push
    cuts the turns in flight, which go on under the new weights (async with
    trainer.async.partial_rollouts), else it waits for them (nothing is in flight in sync mode)."""

    def __init__(
        self,
        engine: EngineClient,
        sync: Transport,
        learners: list[LearnerGroup],
        engine_cfg: EngineConfig,
        fleet: Fleet | None,
        cut: bool,
        out: Path,
        console: Console,
    ) -> None:
        self.engine, self.sync, self.learners = engine, sync, learners
        self.engine_cfg, self.fleet, self.cut = engine_cfg, fleet, cut
        self.out, self.console = out, console

    # -- a step's hand-over --------------------------------------------------------------------

    async def to_learner(self) -> None:
        """Colocated: the engine frees its GPU memory, the learners move their state onto it."""
        if self.engine_cfg.colocate:
            await self.engine.control.release_memory_occupation()
            for g in self.learners:
                g.onload()

    async def to_engine(self) -> None:
        """Colocated: the learners leave the GPU, the engine takes its caches back."""
        if self.engine_cfg.colocate:
            for g in self.learners:
                g.offload()
            await self.engine.control.resume_memory_occupation(["kv_cache", "cuda_graph"])

    async def push(self, version: str) -> dict[str, float]:
        """The learner's weights to every engine as `version`, then the GPU back to them."""
        if self.engine_cfg.colocate:  # weights first, so the learner's tensors can land there
            await self.engine.control.resume_memory_occupation(["weights"])
        # async: the turns in flight are cut and go on after the push
        # (trainer.async.partial_rollouts) or finish first; new ones wait. Sync: nothing is in flight.
        t0 = time.perf_counter()
        async with self.engine.exclusive(pause=self.cut) as inflight:
            waited = time.perf_counter() - t0
            out = await self.sync.push(version=version)
        out["sync/drain_s"] = waited
        out["sync/cut_turns"] = float(inflight if self.cut else 0)
        await self.to_engine()
        return out

    async def relabel(self, version: str) -> None:
        """A skipped step: the engines keep their weights (the step changed none) and say
        `version`, as a push would, so versions keep counting steps in both modes: sync's check
        that every turn comes from the last step's weights holds, async's launch budget
        (agentrl/producer.py) moves on, and a token's staleness counts at least the updates
        since it was sampled. Nothing is cut: the turns in flight sampled the same weights. A
        server that does not answer is restarted by the next rollout's recovery, which pushes
        it this version."""
        try:
            await self.engine.control.update_weight_version(version, abort_all_requests=False)
        except EngineUnavailable as e:
            log.warning("weight version %s did not reach every server: %s", version, e)

    # -- restarts ------------------------------------------------------------------------------

    async def recover(self, step: int, suspect: bool) -> int:
        """After the rollout of step `step`: servers that died (or, when episodes were lost
        (`suspect`) yet every server is up, hang) are restarted and get the current weights
        (colocated: through a hand-over). Returns how many were restarted."""
        down = await self._down()
        if not down and not suspect:
            return 0
        if not down:  # episodes failed yet every server is up: one may hang; each generates
            down = await self._down(deep=True)  # a token (they hold their memory: no release yet)
        restarted = await self._restart(down, "during", step)
        if restarted:  # the restarted server has the weights it started with: the current ones
            await self.to_learner()  # colocated: the learner's weights go back
            await self.push(version=str(step - 1))  # async: waits for (or cuts) turns
        return len(restarted)

    async def revive_before_push(self, step: int) -> float:
        """Before step `step`'s push: servers that died while the learner worked are restarted
        so the push reaches them (it would fail, or block in a collective, on a dead one).
        Colocated, the learner steps off the GPU while they start, and they release their memory
        as the others did after the rollout. Returns how many were restarted."""
        down = await self._down()  # colocated: the servers are released, /health only
        if not down:
            return 0.0
        colocated = self.engine_cfg.colocate
        if colocated:
            for g in self.learners:
                g.offload()
        restarted = await self._restart(down, "after the rollout of", step)
        if colocated:
            for url in restarted:
                async with EngineClient([url], timeout_s=self.engine_cfg.timeout_s,
                                        api_key=self.engine_cfg.token()) as one:  # fmt: skip
                    await one.control.release_memory_occupation()
            for g in self.learners:
                g.onload()
        return float(len(restarted))

    async def _down(self, deep: bool = False) -> list[str]:
        """Servers that died or stopped answering. Not `deep`: the processes we started and
        their /health (a liveness probe, safe on a server whose memory is released). `deep`:
        every server, ours or `engine.urls`, generates a token (only while they hold memory)."""
        if self.fleet is not None and self.fleet.owned:
            return await asyncio.to_thread(self.fleet.down, deep)
        if not deep:
            return []
        return [url for url, ok in (await self.engine.control.health(deep=True)).items() if not ok]

    async def _restart(self, down: list[str], when: str, step: int) -> list[str]:
        """Restart `down` on their ports and set the weight sync up again (its groups lost a
        member); servers we did not start stop the run."""
        if not down:
            return []
        if self.fleet is None or not self.fleet.owned:
            raise TrainingError(
                f"rollout server(s) {down} stopped answering {when} step {step} "
                f"(logs in {self.out}); fix the cause and resume with checkpoint.resume=auto"
            )
        restarted = [u for u in down if u in self.fleet.urls]
        self.console.print(
            f"[yellow]rollout server(s) {restarted} died or hung {when} step "
            f"{step}: restarting (logs in {self.out})[/]"
        )
        try:
            await asyncio.to_thread(self.fleet.restart, restarted)
        except EngineUnavailable as e:
            raise TrainingError(str(e)) from None
        await self.sync.close()
        await self.sync.setup()
        return restarted

"""Rollout servers and the sandbox service this run started that die or hang, brought back
without losing work: the Trainer's part that restarts them (a mixin of `agentrl.train.Trainer`,
which owns the fleet, the engine client, the weight sync and the GPU hand-over it uses).

- During the rollout (`_recover_engines`, after every rollout): the dead servers are restarted on
  their ports (`engine.max_restarts` each), get the current weights, and the groups that lost an
  episode to them are rolled out again, whole.
- While the learner scores and updates (`_revive_before_push`, just before the push): the dead
  servers are restarted and the step's own push gives them the new weights. Colocated, the
  learner leaves the GPU while the server starts and the new server releases its memory before
  the learner comes back, so the push finds every server in the same state.
- The sandbox service (after every rollout): one this run started that died is restarted (its
  client restarts it too, at the first refused call), and the groups that lost an episode to
  the sandbox (`sandbox_unavailable`) are rolled out again, whole. Episodes still without a
  sandbox past `trainer.max_unavailable_frac` of the step stop the run with the cause.
- During a push itself: not recoverable in place (a collective with a dead member blocks until its
  timeout); the run stops with the error and resumes from its last checkpoint.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from agentrl.engine import EngineClient, EngineUnavailable
from agentrl.rollout import engine_lost
from agentrl.sandbox.base import Revivable, SandboxUnavailable
from agentrl.types import StopReason, Task, Trajectory


def _lost(tr: Trajectory) -> bool:
    """An episode the system lost (its engine, or its sandbox): its group is rolled out again."""
    return engine_lost(tr) or tr.stop_reason == StopReason.SANDBOX_UNAVAILABLE


if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from agentrl.engine import Fleet
    from agentrl.learner.group import LearnerGroup
    from agentrl.rollout import Rollout
    from agentrl.weight_sync import Transport


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and what to do."""


class EngineRecovery:
    cfg: Any  # agentrl.config.Config (entry-point layer)
    out: Path
    console: Console
    fleet: Fleet | None
    engine: EngineClient
    rollout: Rollout
    sync: Transport
    step_idx: int
    sandbox_restarts: int  # the sandbox client's restarts when last counted

    if TYPE_CHECKING:  # the Trainer's

        async def _hand_gpu(self, to_learner: bool) -> None: ...
        async def _sync(self, version: str) -> dict[str, float]: ...
        def _learners(self) -> list[LearnerGroup]: ...

    async def _down(self, deep: bool = False) -> list[str]:
        """Servers that died or stopped answering. Not `deep`: the processes we started and
        their /health (a liveness probe, safe on a server whose memory is released). `deep`:
        every server, ours or `engine.urls`, generates a token (only while they hold memory)."""
        if self.fleet is not None and self.fleet.owned:
            return await asyncio.to_thread(self.fleet.down, deep)
        if not deep:
            return []
        return [url for url, ok in (await self.engine.health(deep=True)).items() if not ok]

    async def _recover_engines(
        self, tasks: list[Task], groups: list[list[Trajectory]]
    ) -> tuple[list[list[Trajectory]], dict[str, float]]:
        """After the rollout: servers that died or hung are restarted, get the current weights
        (colocated: through a step's hand-over), and the groups that lost an episode to them are
        rolled out again, whole, so every group's baseline compares samples of the same policy.
        Servers we did not start (`engine.urls`) are not restarted: the run stops with their
        names (resume with trainer.resume=auto)."""
        lost = [i for i, g in enumerate(groups) if any(_lost(tr) for tr in g)]
        revived = await self._revive_sandbox()
        down = await self._down()
        if not down and not lost:
            return groups, {
                "engine/restarts": 0.0,
                "sandbox/restarts": float(revived),
                "rollout/reissued": 0.0,
            }
        if not down:  # episodes failed yet every server is up: one may hang; each generates
            down = await self._down(deep=True)  # a token (they hold their memory: no release yet)
        restarted = await self._restart(down, "during")
        if restarted:  # the restarted server has the weights it started with: the current ones
            await self._hand_gpu(to_learner=True)  # colocated: the learner's weights go back
            await self._sync(version=str(self.step_idx))  # async: waits for (or cuts) turns
        if lost:
            again = await self.rollout.run([tasks[i] for i in lost])
            for i, g in zip(lost, again, strict=True):
                groups[i] = g
            if any(engine_lost(tr) for g in again for tr in g):
                raise TrainingError(
                    f"step {self.step_idx + 1}: episodes lost their rollout server again after "
                    f"the restart (logs in {self.out})"
                )
            self._check_sandbox([tr for i in lost for tr in groups[i]], len(groups))
        return groups, {
            "engine/restarts": float(len(restarted)),
            "sandbox/restarts": float(revived),
            "rollout/reissued": float(sum(len(groups[i]) for i in lost)),
        }

    async def _revive_sandbox(self) -> int:
        """The sandbox service this run started is restarted if it died (its client also does
        so at the first refused call); returns the restarts since the last look. A service given
        by URL is not ours to restart; past `sandbox.max_restarts` the run stops."""
        sandbox = self.rollout.sandbox
        if not isinstance(sandbox, Revivable):
            return 0
        try:
            await sandbox.revive()
        except SandboxUnavailable as e:
            raise TrainingError(
                f"step {self.step_idx + 1}: {e}. Fix the cause, then resume with "
                "trainer.resume=auto"
            ) from None
        seen, self.sandbox_restarts = self.sandbox_restarts, sandbox.restarts
        return sandbox.restarts - seen

    def _check_sandbox(self, again: list[Trajectory], n_groups: int) -> None:
        """After the re-issue: episodes still without a sandbox past
        `trainer.max_unavailable_frac` of the step stop the run with the cause, rather than
        training on a step that silently lost them (they leave the baseline)."""
        still = [tr for tr in again if tr.stop_reason == StopReason.SANDBOX_UNAVAILABLE]
        total = max(1, n_groups * self.cfg.rollout.group_size)
        if still and len(still) / total > self.cfg.trainer.max_unavailable_frac:
            raise TrainingError(
                f"step {self.step_idx + 1}: {len(still)} of {total} episodes had no sandbox even "
                f"after their groups were rolled out again (trainer.max_unavailable_frac="
                f"{self.cfg.trainer.max_unavailable_frac:g}). The sandbox service is down or "
                f"refusing calls: {still[0].error}. Fix it, then resume with trainer.resume=auto"
            )

    async def _revive_before_push(self) -> float:
        """Before the step's push: servers that died while the learner worked are restarted so
        the push reaches them (it would fail, or block in a collective, on a dead one). Colocated,
        the learner steps off the GPU while they start, and they release their memory as the
        others did after the rollout. Returns how many were restarted."""
        down = await self._down()  # colocated: the servers are released, /health only
        if not down:
            return 0.0
        colocated = self.cfg.engine.colocate
        if colocated:
            for g in self._learners():
                g.offload()
        restarted = await self._restart(down, "after the rollout of")
        if colocated:
            for url in restarted:
                async with EngineClient([url], timeout_s=self.cfg.engine.timeout_s,
                                        api_key=self.cfg.engine.token()) as one:  # fmt: skip
                    await one.release_memory_occupation()
            for g in self._learners():
                g.onload()
        return float(len(restarted))

    async def _restart(self, down: list[str], when: str) -> list[str]:
        """Restart `down` on their ports and set the weight sync up again (its groups lost a
        member); servers we did not start stop the run."""
        if not down:
            return []
        if self.fleet is None or not self.fleet.owned:
            raise TrainingError(
                f"rollout server(s) {down} stopped answering {when} step {self.step_idx + 1} "
                f"(logs in {self.out}); fix the cause and resume with trainer.resume=auto"
            )
        restarted = [u for u in down if u in self.fleet.urls]
        self.console.print(
            f"[yellow]rollout server(s) {restarted} died or hung {when} step "
            f"{self.step_idx + 1}: restarting (logs in {self.out})[/]"
        )
        try:
            await asyncio.to_thread(self.fleet.restart, restarted)
        except EngineUnavailable as e:
            raise TrainingError(str(e)) from None
        await self.sync.close()
        await self.sync.setup()
        return restarted

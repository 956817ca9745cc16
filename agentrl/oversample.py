"""Running a step's groups, all of them or the first ones to finish (over-sampling,
trainer.sampling.oversample_groups): what `Rollout.run` and a mixture's run share."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

from agentrl.tool import gather_all
from agentrl.types import Task, Trajectory


async def run_groups(
    run_group: Callable[[Task], Awaitable[list[Trajectory]]],
    tasks: list[Task],
    keep: int | None = None,
    kind: Callable[[Task], str] | None = None,
) -> list[list[Trajectory]]:
    """`Rollout.run` for any `run_group` (a mixture's too, agentrl/mixture.py): every task's
    group in task order, or with `keep` the first `keep` to finish, the rest cancelled.

    `kind` (a mixture: each task's env): each kind keeps as many groups as it has among the first
    `keep` tasks (the draws a step without over-sampling would have trained), its first to
    finish; the later tasks are spares for their own kind only. Over all kinds, the first to
    finish would have let a quick env take the slow envs' share of every step."""
    if keep is None or keep >= len(tasks):
        return await gather_all(run_group(t) for t in tasks)  # one raises: the others stop
    quota = Counter(kind(t) if kind else "" for t in tasks[:keep])
    running = {asyncio.ensure_future(run_group(t)): i for i, t in enumerate(tasks)}
    done: dict[int, list[Trajectory]] = {}
    try:
        while len(done) < keep:
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for f in sorted(finished, key=running.__getitem__):  # several: launch order decides
                i = running.pop(f)
                k = kind(tasks[i]) if kind else ""
                if quota[k] > 0:
                    done[i] = f.result()
                    quota[k] -= 1
                elif not f.cancelled():
                    f.exception()  # a spare of a kind already full: its outcome is not used
    finally:
        for f in running:
            f.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    return [done[i] for i in sorted(done)]

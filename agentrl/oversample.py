"""Running a step's groups, all of them or the first ones to finish (over-sampling,
trainer.sampling.oversample_groups): what `Rollout.run` and a mixture's run share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agentrl.tool import gather_all
from agentrl.types import Task, Trajectory


async def run_groups(
    run_group: Callable[[Task], Awaitable[list[Trajectory]]],
    tasks: list[Task],
    keep: int | None = None,
) -> list[list[Trajectory]]:
    """`Rollout.run` for any `run_group` (a mixture's too, agentrl/mixture.py): every task's
    group in task order, or with `keep` the first `keep` to finish, the rest cancelled."""
    if keep is None or keep >= len(tasks):
        return await gather_all(run_group(t) for t in tasks)  # one raises: the others stop
    running = {asyncio.ensure_future(run_group(t)): i for i, t in enumerate(tasks)}
    done: dict[int, list[Trajectory]] = {}
    try:
        while len(done) < keep:
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for f in sorted(finished, key=running.__getitem__)[: keep - len(done)]:
                done[running.pop(f)] = f.result()  # several at once: launch order decides
    finally:
        for f in running:
            f.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    return [done[i] for i in sorted(done)]

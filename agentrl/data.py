"""Task sampling: seeded, epoch-shuffled, resumable from a two-number cursor.

sampler = TaskSampler(env_cls.load_tasks(**cfg.env.tasks), seed=0)
batch = sampler.next(8)                 # 8 tasks; wraps into a new shuffled epoch when needed
state = sampler.state_dict()            # {"epoch": 0, "index": 8} — saved in checkpoints
TaskSampler(tasks, seed=0).load_state_dict(state)   # continues with exactly the same tasks
"""

from __future__ import annotations

import random

from agentrl.types import Task


class TaskSampler:
    def __init__(self, tasks: list[Task], seed: int = 0, shuffle: bool = True) -> None:
        if not tasks:
            raise ValueError("TaskSampler needs at least one task; check env.tasks")
        self.tasks, self.seed, self.shuffle = tasks, seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._make_order(0)

    def _make_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self, n: int) -> list[Task]:
        out = []
        while len(out) < n:
            if self.index >= len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._make_order(self.epoch)
            out.append(self.tasks[self._order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._make_order(self.epoch)

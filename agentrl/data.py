"""Task sampling: seeded, epoch-shuffled, resumable from a two-number cursor.

sampler = TaskSampler(env_cls.load_tasks(**cfg.env.tasks), seed=0)
batch = sampler.next(8)                 # 8 tasks; wraps into a new shuffled epoch when needed
state = sampler.state_dict()            # {"epoch": 0, "index": 8, "tasks": 256} — in checkpoints
TaskSampler(tasks, seed=0).load_state_dict(state)   # continues with exactly the same tasks

A task list (`check_tasks`, on whatever env.tasks or env.eval_tasks loads) holds one task at
least, each with an id of its own: held-out splits, re-issued groups and trajectories name
tasks by id.

A held-out evaluation (trainer.eval.split=heldout) trains on the rest of the list:

train = held_out(tasks, eval_tasks)     # no task of eval_tasks' ids, nor of their prompts
"""

from __future__ import annotations

import json
import random
from collections import Counter

from agentrl.types import ConfigError, Task


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
        return {"epoch": self.epoch, "index": self.index, "tasks": len(self.tasks)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """The cursor of a run over the same list; a list of another length (the evaluation set
        held out or not: trainer.eval.every, trainer.eval.split) would continue on other tasks."""
        saved = state.get("tasks")
        if saved is not None and int(saved) != len(self.tasks):
            raise ConfigError(
                f"the checkpoint's run trained on {saved} tasks, this one on {len(self.tasks)}: "
                "the training list changed (trainer.eval.every or trainer.eval.split, which hold "
                "the evaluation set out of it, or env.tasks). Resume with the settings it ran "
                "with, or start fresh (checkpoint.resume=never)"
            )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._make_order(self.epoch)


def check_tasks(tasks: list[Task], source: str) -> list[Task]:
    """`tasks` when it is a task list (module docstring), else a ConfigError naming `source`
    (`env.tasks: MyEnv.load_tasks`)."""
    if not tasks:
        raise ConfigError(f"{source} returned no tasks: give it options that select some")
    if wrong := [(i, t) for i, t in enumerate(tasks) if not isinstance(t, Task)]:
        i, t = wrong[0]
        raise ConfigError(
            f"{source}: item {i} is a {type(t).__name__} ({t!r:.60}), not a Task; return "
            "Task(id=..., data={...}) items (from agentrl.types import Task)"
        )
    repeated = [(k, n) for k, n in Counter(t.id for t in tasks).items() if n > 1]
    if repeated:
        (first, n), more = repeated[0], len(repeated) - 1
        raise ConfigError(
            f"{source}: {n} tasks share the id {first!r}"
            + (f" ({more} more ids are repeated)" if more else "")
            + ": a task's id names it in the held-out evaluation split, in re-issued groups and "
            "in trajectories, so tasks sharing one are taken for each other. Give each task its "
            "own id (a JSONL line without one gets its line number)"
        )
    return tasks


def prompt_text(task: Task) -> str:
    """What a task asks: its `prompt` when that is a string, else all its data as JSON."""
    prompt = task.data.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(task.data, sort_keys=True, default=str)


def held_out(tasks: list[Task], evaluation: list[Task]) -> list[Task]:
    """The tasks sharing neither an id nor a prompt (`prompt_text`) with `evaluation`: a
    generated list can hold the same question under two ids, and two lists the same id."""
    ids = {t.id for t in evaluation}
    prompts = {prompt_text(t) for t in evaluation}
    return [t for t in tasks if t.id not in ids and prompt_text(t) not in prompts]

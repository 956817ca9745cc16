import pytest

from agentrl.data import TaskSampler
from agentrl.types import ConfigError, Task

TASKS = [Task(id=str(i)) for i in range(5)]


def ids(tasks):
    return [t.id for t in tasks]


def test_epochs_cover_every_task_once_and_reshuffle():
    s = TaskSampler(TASKS, seed=1)
    e0, e1 = ids(s.next(5)), ids(s.next(5))
    assert sorted(e0) == sorted(e1) == [str(i) for i in range(5)]
    assert e0 != e1 and s.state_dict() == {"epoch": 1, "index": 5, "tasks": 5}


def test_resume_continues_the_same_sequence():
    full = ids(TaskSampler(TASKS, seed=3).next(13))
    a = TaskSampler(TASKS, seed=3)
    first = ids(a.next(7))
    b = TaskSampler(TASKS, seed=3)
    b.load_state_dict(a.state_dict())
    assert first + ids(b.next(6)) == full
    TaskSampler(TASKS, seed=3).load_state_dict({"epoch": 0, "index": 7})  # older checkpoints


def test_a_cursor_over_another_list_is_refused():
    """Holding the evaluation set out (trainer.eval.every, eval.split) changes the training list;
    the saved cursor would continue on other tasks."""
    state = TaskSampler(TASKS, seed=3).state_dict()
    with pytest.raises(ConfigError, match="trained on 5 tasks, this one on 4"):
        TaskSampler(TASKS[:4], seed=3).load_state_dict(state)

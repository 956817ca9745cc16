"""What a learner rank raised reaches the driver as the command should print it. Found by a
red-team pass: a checkpoint whose optimizer shards were cut short failed on the rank with a
CheckpointError (one line: the path, the fix), which the driver printed as Ray's whole remote
traceback."""

from __future__ import annotations

import ray

from agentrl.ckpt import CheckpointError
from agentrl.learner.group import rank_error
from agentrl.types import ConfigError


def test_a_ranks_error_for_people_reaches_the_driver_as_itself():
    for error in (CheckpointError("optim: cut short; resume another"), ConfigError("x: fix")):
        remote = ray.exceptions.RayTaskError("load_checkpoint", "Traceback ...\n  File", error)
        assert rank_error(remote) is error
    other = ray.exceptions.RayTaskError("step", "Traceback (remote)", ValueError("bad"))
    raised = rank_error(other)  # Ray's copy, as before: its remote traceback for a bug
    assert isinstance(raised, ValueError) and isinstance(raised, ray.exceptions.RayTaskError)

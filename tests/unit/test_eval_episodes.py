"""An evaluation counts episodes, not the sequences they were trained as: an episode that
rollout.thinking=template, a context rewrite (rollout.context.policy) or an agent's fork left as
several sequences is one episode of eval/episodes, eval/failed, eval/turns and the rest."""

from __future__ import annotations

import asyncio

from agentrl.evaluate import evaluate
from agentrl.types import FinishReason, Message, StopReason, Task, Trajectory, Turn


def sequence(task: Task, i: int, k: int, stop: StopReason) -> Trajectory:
    """Sequence `k` of episode `i`: one turn of one tool call; reward 1 unless it failed."""
    turn = Turn(start=2, end=4, obs_end=4, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant"), num_tool_calls=1)  # fmt: skip
    return Trajectory(task_id=task.id, sample_index=i, token_ids=[0, 1, 2, 3],
                      loss_mask=[0, 0, 1, 1], logprobs=[0, 0, -1, -1], prompt_len=2,
                      turns=[turn], messages=[], stop_reason=stop,
                      reward=0.0 if stop.is_infra_failure else 1.0,
                      metadata={"session": f"{task.id}:{i}", "sequence": k})  # fmt: skip


class ForkingRollout:
    """Every episode is two sequences (a rewrite halfway); episode 0 of each task is aborted."""

    async def run_group(self, task: Task, n: int | None = None) -> list[Trajectory]:
        stops = [StopReason.ABORTED] + [StopReason.COMPLETED] * ((n or 1) - 1)
        return [sequence(task, i, k, stop) for i, stop in enumerate(stops) for k in range(2)]


def test_eval_counts_each_episode_once_however_many_sequences_it_has():
    """Found by a red-team pass: with episodes of two sequences, 3 tasks x 4 samples reported
    eval/episodes 24 and eval/failed 6 (3 episodes failed), and eval/turns and eval/tool_calls
    were per sequence (1 each) where each episode took 2 turns and made 2 calls."""
    tasks = [Task(id=f"t{j}", data={"prompt": str(j)}) for j in range(3)]
    out, trajs = asyncio.run(evaluate(ForkingRollout(), tasks, samples=4))
    assert len(trajs) == 24  # every sequence is saved (eval_trajectories.jsonl)
    assert out["eval/episodes"] == 12 and out["eval/failed"] == 3
    assert out["eval/reward_mean"] == 1.0  # over the 9 scored episodes
    assert out["eval/turns"] == 2.0 and out["eval/tool_calls"] == 2.0
    assert out["eval/tool_call_rate"] == 1.0  # a share of turns: as it was

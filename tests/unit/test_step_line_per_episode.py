"""The step line's turns and tool failures are per episode, as it says, when an episode is
several sequences (rollout.thinking=template, a context rewrite: one trajectory each)."""

from agentrl.display import progress_text
from agentrl.metrics import rollout_metrics
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


def _sequence(k: int) -> Trajectory:
    # one turn sampled on this sequence, its tool call failed by the model's fault
    turn = Turn(1, 2, 3, "0", FinishReason.STOP, Message(role="assistant"), text="x",
                num_tool_errors=1)  # fmt: skip
    return Trajectory("t1", 0, [1, 2, 3], [0, 1, 0], [0.0] * 3, 1, [turn],
                      [Message(role="user", content="q")], StopReason.COMPLETED,
                      metadata={"session": "ep-1", "sequence": k})  # fmt: skip


def test_a_three_turn_episode_of_three_sequences_reads_three_turns():
    m = rollout_metrics([_sequence(k) for k in range(3)])  # one episode, 3 turns, 3 failed calls
    m["step"] = 1.0
    text = progress_text(m, 10).plain
    assert "turns 3.0" in text
    assert "tool err 3.00 /episode" in text

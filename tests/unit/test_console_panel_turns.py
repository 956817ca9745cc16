"""The console's trajectory panel shows each sampled turn's own text beside its own message."""

from rich.console import Console

from agentrl.display import trajectory_panel
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


def test_a_later_sequence_shows_its_history_as_written_and_its_turn_as_sampled():
    # one of an episode's sequences (rollout.thinking=template, a context rewrite): its prompt
    # holds the earlier turns as history messages; only the last turn was sampled on it
    msgs = [
        Message(role="user", content="2+2?"),
        Message(role="assistant", content="EARLIER-HISTORY-TURN"),
        Message(role="tool", content="4"),
        Message(role="assistant", content="parsed"),
    ]
    turn = Turn(3, 5, 5, "0", FinishReason.STOP, msgs[-1], text="SAMPLED-TEXT")
    t = Trajectory("t1", 0, [1, 2, 3, 4, 5], [0, 0, 0, 1, 1], [0.0] * 5, 3, [turn], msgs,
                   StopReason.COMPLETED, metadata={"sequence": 1})  # fmt: skip
    console = Console(record=True, width=200)
    console.print(trajectory_panel(t))
    lines = [x for x in console.export_text().splitlines() if "assistant │" in x]
    assert "EARLIER-HISTORY-TURN" in lines[0] and "SAMPLED-TEXT" in lines[1]

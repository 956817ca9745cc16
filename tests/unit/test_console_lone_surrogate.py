"""A trajectory panel (`agentrl preview`, logging.console_trajectories_every) with a lone
surrogate from a tool (a tool call's JSON "\\ud800" decodes to one) prints, written out: a
terminal's UTF-8 stream cannot encode it, and printing it raised in the middle of the run."""

import io

from rich.console import Console

from agentrl.display import print_trajectories
from agentrl.types import Message, StopReason, Trajectory


def test_a_lone_surrogate_in_a_panel_is_written_out_not_printed():
    msgs = [Message(role="user", content="hi"), Message(role="tool", content="a\ud800b")]
    traj = Trajectory("t\udc80", 0, [], [], [], 0, [], msgs, StopReason.ABORTED, error="e\ud800")
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # a terminal's: strict
    print_trajectories([traj], Console(file=stream, width=200))  # raised UnicodeEncodeError
    stream.flush()
    shown = stream.buffer.getvalue().decode("utf-8")
    assert "a\\ud800b" in shown and "error: e\\ud800" in shown and "t\\udc80 #0" in shown

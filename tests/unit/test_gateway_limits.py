"""Requests too big for the context, refused before the work they would cost in the event loop
every episode shares (agentrl/gateway/limits.py), and a request's `n` samples rendered once: a
red-team pass found 1.8 MB of empty messages held the gateway's loop 3.2 s (every other episode's
requests waiting) before their context_length_exceeded."""

from __future__ import annotations

USER = {"role": "user", "content": "hi"}


class Visits(list):
    """A list that counts the items read by index."""

    visits = 0

    def __getitem__(self, i):
        self.visits += len(range(*i.indices(len(self)))) if isinstance(i, slice) else 1
        return super().__getitem__(i)


def test_input_items_are_read_a_bounded_number_of_times():
    """Each function_call item of a Responses API input looked back for the turn it belongs to
    through a copy of every item before it: 40k calls (2 MB) were 1.4 s of parsing, quadratic."""
    from agentrl.gateway.responses import parse_responses_request

    items = Visits([{"role": "user", "content": "hi"}, {"type": "reasoning"}])
    items += [{"type": "function_call", "call_id": f"c{i}", "name": "f"} for i in range(2000)]
    items += [{"type": "function_call_output", "call_id": "c0", "output": "1"}]
    req = parse_responses_request({"input": items})
    assert [m.role for m in req.messages] == ["user", "assistant", "tool"]
    assert len(req.messages[1].tool_calls) == 2000 and items.visits <= 2 * len(items)

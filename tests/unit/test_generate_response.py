"""An SGLang /generate body read into a Completion (agentrl/engine/protocol.py): orjson's ints
and floats are taken as they are, and every other body reads as it did when each value went
through int() and float(): the same ids, logprobs and errors."""

import orjson
import pytest

from agentrl.engine.protocol import EngineProtocolError, parse_generate_response
from agentrl.types import Completion, FinishReason


def converted(data, server=""):
    """The reading before: each id through int(), each logprob through float()."""
    try:
        meta = data["meta_info"]
        out = [int(t) for t in data["output_ids"]]
        fr = meta.get("finish_reason") or {}
        finish = FinishReason(fr.get("type"))
    except (KeyError, TypeError, ValueError) as e:
        raise EngineProtocolError(f"{server}: not an SGLang /generate response ({e!r})") from e
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise EngineProtocolError(f"{server}: no output_token_logprobs; send return_logprob=True")
    lp_ids = [int(e[1]) for e in entries]
    logprobs = [float(e[0]) for e in entries]
    matched = fr.get("matched")
    matched = matched if isinstance(matched, int) and not isinstance(matched, bool) else None
    if lp_ids != out:
        if matched is not None and lp_ids[:-1] == out and lp_ids[-1] == matched:
            out = lp_ids
        elif finish is FinishReason.ABORT and lp_ids == out[: len(lp_ids)]:
            out = out[: len(lp_ids)]
        else:
            raise EngineProtocolError(
                f"{server}: output_ids ({len(out)}) and output_token_logprobs ({len(lp_ids)}) "
                "disagree"
            )
    return out, logprobs, finish, matched


def body(out, entries, finish=None):
    finish = finish or {"type": "stop", "matched": 7}
    return {"output_ids": out, "meta_info": {"finish_reason": finish, "weight_version": "3",
                                             "output_token_logprobs": entries}}  # fmt: skip


def outcome(fn, data):
    try:
        got = fn(data)
    except Exception as e:  # noqa: BLE001 - the same errors are part of the same reading
        return type(e).__name__, str(e)
    if isinstance(got, Completion):
        got = got.token_ids, got.logprobs, got.finish_reason, got.matched_stop
    return (
        [(type(x).__name__, x) for x in got[0]],
        [(type(x).__name__, x) for x in got[1]],
        *got[2:],
    )


BODIES = {
    "typed": body([5, 6, 7], [[-0.5, 5, None], [-1.5, 6, None], [-0.0, 7, None]]),
    "stop trimmed": body([5, 6], [[-0.5, 5, None], [-1.5, 6, None], [-2.0, 7, None]]),
    "aborted": body([5, 6], [[-0.5, 5, None]], {"type": "abort"}),
    "bool ids": body([True, 6], [[-0.5, 1, None], [-1.5, 6, None]]),
    "float ids": body([5.0, 6], [[-0.5, 5, None], [-1.5, 6.0, None]]),
    "string ids": body(["5"], [[-0.5, "5", None]]),
    "int logprob": body([5], [[0, 5, None]]),
    "string logprob": body([5], [["-1.5", 5, None]]),
    "None logprob": body([5], [[None, 5, None]]),
    "None id": body([5], [[-0.5, None, None]]),
    "None in output_ids": body([None], [[-0.5, 5, None]]),
    "short entry": body([5], [[-0.5]]),
    "ids disagree": body([5, 6], [[-0.5, 5, None], [-1.5, 9, None]]),
    "bool matched": body(
        [5], [[-0.5, 5, None], [-0.5, 1, None]], {"type": "stop", "matched": True}
    ),
    "no logprobs": body([5], None),
    "ids not a list": body("56", [[-0.5, 5, None], [-1.5, 6, None]]),
    "unknown finish": body([5], [[-0.5, 5, None]], {"type": "nope"}),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_a_body_reads_as_with_int_and_float(name):
    data = orjson.loads(orjson.dumps(BODIES[name]))
    assert outcome(parse_generate_response, data) == outcome(converted, data)


def test_orjson_s_ids_are_taken_not_copied():
    """The ids orjson read are the Completion's (a copy of them cost a pass per response)."""
    data = orjson.loads(orjson.dumps(BODIES["typed"]))
    comp = parse_generate_response(data)
    assert comp.token_ids is data["output_ids"] and comp.logprobs == [-0.5, -1.5, -0.0]

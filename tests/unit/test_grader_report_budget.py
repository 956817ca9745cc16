"""A batch call's report fits the sandbox's output whatever the solution makes its tests say: each
test's frame gets its share (texts cut with a marker saying how much, values then compared
through their hashes), so a policy cannot turn its failing tests into a lost report, which
grade() raises as SandboxUnavailable (the episode out of its group's baseline, as an outage).
A harness that fails before the solution runs is still an outage, and tampering still said.
On the subprocess backend (64 KiB of stdout kept, as the local service's limits.output_bytes),
through grade(); test_grader_attacks.py runs the same on the local service."""

from __future__ import annotations

import pytest

from agentrl.sandbox import ExecResult, SandboxUnavailable, SubprocessSandbox
from agentrl.sandbox.grader import _MAX_BATCH, _REPORT_BYTES, CallTest, grade

# each test fails with 5,000 characters of error text, each a JSON escape of 6 bytes
LONG_ERRORS = "def f(k):\n    raise ValueError('\\x01' * 5000)\n"
RESULT_FD = "import os, sys\nfd = int(sys.argv[5])\n"
WORST = {  # what makes each kind of frame as large as a solution can
    "errors of escapes": LONG_ERRORS,
    "errors of lone surrogates": "def f(k):\n    raise ValueError('\\ud800' * 5000)\n",
    "errors of 4-byte characters": "def f(k):\n    raise ValueError('\\U0001f600' * 5000)\n",
    "wrong values of escapes": "def f(k):\n    return '\\x01' * 250\n",
    "wrong values, emoji": "def f(k):\n    return ['\\U0001f600' * 40] * 20\n",
    "stderr, then dies": "import os\ndef f(k):\n    os.write(2, b'\\x01' * 999)\n    os._exit(3)\n",
    "loading fails": "raise ImportError('\\x01' * 5000)\n",
}
FORGED = RESULT_FD + (  # one line more than calls, each 30 KB of escapes
    r"""os.write(fd, (b'{"err": "' + b'\\u0001' * 5000 + b'"}\n') * N)""".replace(
        "N", str(_MAX_BATCH + 1)
    )
)


class Recording(SubprocessSandbox):
    """The subprocess sandbox, keeping every call's result (the harness's report in stdout)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.results: list[ExecResult] = []

    async def run(self, code, language="python", timeout=10.0, session=None):
        res = await super().run(code, language, timeout, session)
        self.results.append(res)
        return res


def checks(n: int) -> list[CallTest]:
    return [CallTest(call=f"f({k})", expected=k) for k in range(n)]


async def test_a_chunk_of_long_errors_scores_zero_not_an_outage() -> None:
    """A red-team pass: 300 tests in one batch call, each failing with a long error, made the
    report overflow the 64 KiB the sandbox keeps: on the local service grade() then raised
    SandboxUnavailable (test_grader_attacks.py), here the tests past the cut came back
    'missing', their errors unsaid. Now each test fails as an error, its text cut with a
    marker, and a note says the reports were cut."""
    res = await grade(SubprocessSandbox(), LONG_ERRORS, checks(300), timeout_s=0.19,
                      max_call_s=60.0, batch=True)  # fmt: skip
    assert res.passed == 0 and res.total == 300 and res.tampered == 0
    assert all(o.status == "error" for o in res.outcomes), res.outcomes[0]
    assert all("more characters cut]" in o.detail for o in res.outcomes), res.outcomes[0]
    assert any("cut to their share" in n for n in res.notes), res.notes


@pytest.mark.parametrize("name", sorted(WORST))
async def test_every_frame_fits_its_share_of_the_report(name: str) -> None:
    """The worst a solution can make a full chunk's frames say: the whole report (the start
    record with its 250 indices aside) stays within _REPORT_BYTES, and every test is judged."""
    sb = Recording(max_output_bytes=16 << 20)  # keeps it all: what the harness wrote, measured
    res = await grade(sb, WORST[name], checks(_MAX_BATCH), timeout_s=0.2, max_call_s=60.0,
                      batch=True)  # fmt: skip
    assert res.passed == 0 and res.total == _MAX_BATCH and len(sb.results) == 1, res.notes
    report = len(sb.results[0].stdout.encode())
    assert report <= _REPORT_BYTES + 8 * _MAX_BATCH, report


async def test_values_in_a_full_chunk_keep_their_tolerance() -> None:
    """250 correct answers of two floats each: with its hash and preview a frame is past its
    share, so it goes as the value alone and is compared within its tolerance (as a hash it
    would fail: k / 3 + 1e-12 is not k / 3)."""
    tests = [CallTest(call=f"f({k})", expected=[k / 3 + 1e-12, k / 7], tolerance=1e-9)
             for k in range(_MAX_BATCH)]  # fmt: skip
    code = "def f(k):\n    return [k / 3, k / 7]\n"
    res = await grade(SubprocessSandbox(), code, tests, timeout_s=0.2, max_call_s=60.0, batch=True)
    assert res.all_passed and not res.notes, (res.notes, res.outcomes[-1])


async def test_forged_results_past_the_report_are_still_tampering() -> None:
    """Results the solution wrote itself for a full chunk, each 30 KB of escapes: still said
    to tamper, test by test."""
    res = await grade(SubprocessSandbox(), FORGED, checks(_MAX_BATCH), timeout_s=0.2,
                      max_call_s=60.0, batch=True)  # fmt: skip
    assert res.passed == 0 and res.tampered == _MAX_BATCH, res.outcomes[0]


class NoForkSandbox(SubprocessSandbox):
    """A sandbox at its process limit: the harness's fork of the solution is refused."""

    async def run(self, code, language="python", timeout=10.0, session=None):
        refuse = "import os\ndef _no(*a):\n    raise BlockingIOError(11, 'fork refused')\nos.fork = _no\n"
        return await super().run(refuse + code, language, timeout, session)


async def test_a_harness_that_fails_before_the_solution_runs_is_still_an_outage() -> None:
    """The budget changes who pays for a large report, not who is to blame for a lost one:
    a full chunk whose harness cannot start the solution is still the sandbox's failure."""
    with pytest.raises(SandboxUnavailable, match="fork refused"):
        await grade(NoForkSandbox(), LONG_ERRORS, checks(300), timeout_s=0.19,
                    max_call_s=60.0, batch=True)  # fmt: skip

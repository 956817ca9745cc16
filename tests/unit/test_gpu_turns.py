"""The GPU suite's turns (tests/gpu/gpu_helpers.gpu_turn), checked on the CPU: under pytest-xdist
many tests hold the GPU at once, a test marked gpu_alone holds it with nobody else, a waiting one
is not starved by later shared turns, and a turn taken inside a turn (a server a test starts)
takes nothing more."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import gpu_helpers  # noqa: E402


def _hold(turns: str, name: str, alone: bool, release, log) -> None:
    gpu_helpers._TURNS = Path(turns)
    with gpu_helpers.gpu_turn(alone=alone):
        log.put(("in", name, time.monotonic()))  # stamped: a Queue keeps no order across processes
        with gpu_helpers.gpu_turn():  # re-entrant: a server started inside the turn
            release.wait(30)
        log.put(("out", name, time.monotonic()))


def _door_taken(turns: Path) -> bool:
    """Someone waits at the door (an alone turn waiting for the room to empty)."""
    with open(turns / "door", "a") as door:
        try:
            fcntl.flock(door, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(door, fcntl.LOCK_UN)
        return False


def test_an_alone_turn_excludes_the_others_and_later_shared_turns_wait_for_it(tmp_path):
    ctx = mp.get_context("fork")
    log, first, later = ctx.Queue(), ctx.Event(), ctx.Event()
    later.set()  # the alone turn and the late shared one leave as soon as they are in

    def start(name: str, alone: bool, release) -> mp.Process:
        p = ctx.Process(target=_hold, args=(str(tmp_path), name, alone, release, log))
        p.start()
        return p

    procs = [start("s1", False, first), start("s2", False, first)]
    assert {log.get(timeout=30)[:2], log.get(timeout=30)[:2]} == {("in", "s1"), ("in", "s2")}
    procs.append(start("alone", True, later))
    deadline = time.monotonic() + 30
    while not _door_taken(tmp_path):  # the alone turn waits, holding the door
        assert time.monotonic() < deadline, "the alone turn never reached the door"
        time.sleep(0.01)
    procs.append(start("s3", False, later))  # a shared turn asking after it
    first.set()
    events = sorted((log.get(timeout=30) for _ in range(6)), key=lambda e: e[2])
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    order = [f"{k} {n}" for k, n, _ in events]
    alone_in, alone_out = order.index("in alone"), order.index("out alone")
    assert alone_in > max(order.index("out s1"), order.index("out s2")), order
    assert order.index("in s3") > alone_out, order  # not starved, and alone while in


def test_a_process_holds_no_turn_after_its_turns_end(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_helpers, "_TURNS", tmp_path)
    with gpu_helpers.gpu_turn(alone=True), gpu_helpers.gpu_turn():
        pass
    with gpu_helpers.gpu_turn():
        pass
    assert gpu_helpers._held == {"shared": 0, "alone": 0}


def test_workers_share_out_the_gpus_and_a_tests_ids_count_within_its_view(monkeypatch):
    """On two GPUs gw0, gw2, ... run their one-GPU tests on GPU 0 and gw1, gw3, ... on GPU 1; a
    test's "0" is the first GPU it sees, and a two-GPU test's "1" the host's second."""
    two = ["0", "1"]
    assert [gpu_helpers.worker_gpu(f"gw{i}", two) for i in range(4)] == ["0", "1", "0", "1"]
    assert gpu_helpers.worker_gpu("gw5", ["0"]) == "0" and gpu_helpers.worker_gpu("gw1", []) == "0"
    assert gpu_helpers.worker_gpu("master", two) == "0"  # not under xdist
    assert gpu_helpers.worker_gpu("gw1", ["2", "3"]) == "3"  # the suite run on GPUs 2 and 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu_helpers.host_gpus("0") == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_helpers.host_gpus("1") == "1" and gpu_helpers.host_gpus("0,1") == "0,1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_helpers.host_gpus("1") == "1"
    assert gpu_helpers.is_two_gpu_test("t.py::test_colocated_cycles_serve_trainer_weights_"
                                       "without_memory_growth[2]")  # fmt: skip
    assert not gpu_helpers.is_two_gpu_test("t.py::test_colocated_cycles_serve_trainer_weights_"
                                           "without_memory_growth[1]")  # fmt: skip
    assert gpu_helpers.is_two_gpu_test("t.py::test_sglang_serves_trainer_weights_after_push[disk]")


def test_the_suite_order_packs_xdist_workers_longest_first():
    """xdist's loadgroup starts worker k on the k-th test with the (n+k)-th queued behind it: the
    order gives the n longest the start, the longest queued to the worker that frees first, and
    plays out within 3 % of unconstrained longest-first packing; plain longest-first order would
    queue the two longest on worker 0's neighbours in turn and run 12 % over."""
    times = [316, 252, 233, 222, 199, 185, 163, 148, 115, 113, 104, 69, 60, 60, 45, 41, 41, 40,
             27, 2, 1, 193, 144]  # fmt: skip
    order = gpu_helpers.xdist_order(times, 6)
    assert sorted(order) == list(range(len(times)))
    first = [times[i] for i in order[:6]]
    assert first == sorted(sorted(times, reverse=True)[:6])  # shortest of them to worker 0
    planned = gpu_helpers.xdist_seconds([times[i] for i in order], 6)
    ends = [0.0] * 6  # longest first, each test to the worker that frees first, nothing queued
    for t in sorted(times, reverse=True):
        ends[ends.index(min(ends))] += t
    assert planned <= 1.03 * max(ends)
    assert gpu_helpers.xdist_seconds(sorted(times, reverse=True), 6) > 1.1 * planned
    assert gpu_helpers.xdist_seconds([5.0, 3.0], 4) == 5.0  # fewer tests than workers
    assert gpu_helpers.xdist_seconds([5.0, 3.0, 2.0], 1) == 10.0

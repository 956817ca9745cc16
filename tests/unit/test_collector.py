"""agentrl/collector.py: the collector of the process that runs the rollouts, set for a run
(Trainer.run, bench/rollout_overhead.py --gc-freeze) and set back after it."""

import gc

from agentrl import collector


def test_a_run_freezes_the_set_up_and_spaces_the_young_passes_then_undoes_both():
    before = gc.get_threshold()
    settled = collector.settle()
    try:
        assert settled == before and gc.get_freeze_count() > 0
        assert gc.get_threshold() == (collector.YOUNG, *before[1:]) and collector.YOUNG > 700
    finally:
        collector.restore(settled)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0

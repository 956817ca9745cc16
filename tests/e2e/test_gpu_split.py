"""engine.colocate=false on one host: the learner's Ray ranks get the GPUs the split gives them, and
the trainer process (and the servers it starts) keep their own view. Ray hands out GPU ids it is
told of whether or not the box has GPUs, so this runs on CPU with real Ray."""

from __future__ import annotations

import os

import pytest
import ray

from agentrl.learner import RayConfig
from agentrl.learner.ray_start import start_ray, stop_ray

pytestmark = pytest.mark.own_ray  # stops the shared Ray (conftest): runs after its users


@ray.remote(num_gpus=1, num_cpus=0)
class _Rank:  # two alive at once: each holds a GPU of its own, as learner ranks do
    def visible(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def test_ray_hands_the_learner_only_its_gpus(monkeypatch) -> None:
    stop_ray()  # a Ray another test left running would keep its own GPU view
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    try:
        start_ray(RayConfig(object_store_mb=100), gpus=["2", "3"])
        assert ray.cluster_resources().get("GPU") == 2
        ranks = [_Rank.remote() for _ in range(2)]
        seen = sorted(ray.get([r.visible.remote() for r in ranks]))
        assert seen == ["2", "3"]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # the servers' view is untouched
    finally:
        stop_ray()

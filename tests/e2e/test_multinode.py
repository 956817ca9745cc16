"""Two Ray nodes on loopback (`ray.cluster_utils.Cluster`): the trainer joins the cluster through
`ray.address`, its two learner ranks are spread over both nodes (rendezvous over TCP on rank 0's
node address), the dev server is started by a Ray actor on the second node (pinned there by a
custom resource), and one training step pushes its weights to it over gloo."""

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster

from agentrl.config import compose
from agentrl.engine import EngineConfig, RayServer, launch_fleet
from agentrl.learner import LearnerConfig, LearnerError, RayConfig
from agentrl.learner.group import LearnerGroup
from agentrl.learner.ray_start import _loopback, listening_sockets, start_ray, stop_ray
from agentrl.run import open_run
from agentrl.train import Trainer

pytestmark = pytest.mark.own_ray  # stops the shared Ray (conftest): runs after its users

NODE = {"node_ip_address": "127.0.0.1", "num_cpus": 2, "object_store_memory": 80 * 1024**2}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head node and a second node with resource {node2: 10}, both bound to 127.0.0.1."""
    stop_ray()  # not the tests' shared local Ray (conftest): this module runs a cluster
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        before = listening_sockets()
        c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
        try:
            c.add_node(**NODE, resources={"node2": 10})
            exposed = sorted(a for k, a in listening_sockets().items()
                             if k not in before and not _loopback(a))  # fmt: skip
            assert not exposed, f"the cluster's nodes listen beyond loopback: {exposed}"
            yield c
        finally:
            stop_ray()
            c.shutdown()


def test_ranks_that_cannot_be_placed_fail_naming_the_resources(cluster: Cluster, tiny_model_dir):
    start_ray(RayConfig(address=cluster.address))
    cfg = LearnerConfig(model_path=str(tiny_model_dir), num_workers=3, num_cpus_per_worker=1,
                        placement="strict_spread", placement_timeout_s=2)  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(LearnerError, match=r"3 ranks of \{CPU: 1\} .*STRICT_SPREAD.*node2: 10"):
        LearnerGroup(cfg)
    assert time.monotonic() - t0 < 30
    assert ray.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values()
    )


def test_learner_spans_nodes_and_engine_runs_on_the_second(cluster: Cluster, tmp_path: Path):
    cfg = compose([
        f"ray.address={cluster.address}", "learner.num_workers=2", "learner.placement=spread",
        "learner.num_cpus_per_worker=1", "engine.placement=ray", "engine.ray_num_cpus=1",
        "+engine.ray_resources={node2: 1}", "weight_sync.method=distributed",
        "trainer.steps=1", "checkpoint.every=0", f"checkpoint.dir={tmp_path}/ckpt",
        "trainer.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=16",
        "rollout.max_turns=1",
    ])  # fmt: skip
    second = next(n.node_id for n in cluster.worker_nodes)

    async def go() -> tuple[list[dict], list[str], str, list[str]]:
        async with open_run(cfg, tmp_path / "out") as run:
            assert run.policy is not None and run.fleet is not None
            nodes = run.policy.nodes()
            (server,) = run.fleet.procs
            assert isinstance(server, RayServer)
            engine_node = ray.get(server.actor.node_id.remote())
            history = await Trainer(cfg, run).run()
            return (
                history,
                [n["node_id"] for n in nodes],
                engine_node,
                [
                    *(n["ip"] for n in nodes),
                    *run.fleet.urls,
                    *await run.engine.control.get_weight_version(),
                ],
            )

    history, rank_nodes, engine_node, seen = asyncio.run(go())
    assert len(set(rank_nodes)) == 2, f"both ranks on one node: {rank_nodes}"
    assert engine_node == second
    ips, url, version = seen[:2], seen[2], seen[3]
    assert ips == ["127.0.0.1", "127.0.0.1"] and url.startswith("http://127.0.0.1:")
    assert [h["step"] for h in history] == [1.0]
    assert history[0]["sync/seconds"] > 0
    assert version == "1"  # the engine on node 2 serves the weights pushed after step 1


def test_a_ray_placed_server_that_dies_is_restarted_on_its_node(cluster: Cluster, tiny_model_dir,
                                                                tmp_path: Path):  # fmt: skip
    start_ray(RayConfig(address=cluster.address))
    cfg = EngineConfig(placement="ray", ray_num_cpus=1, ray_resources={"node2": 1},
                       health_timeout_s=60, max_restarts=1)  # fmt: skip
    with launch_fleet(cfg, tiny_model_dir, tmp_path) as fleet:
        (url,) = fleet.urls
        port = url.rsplit(":", 1)[1]
        (pid,) = {p for (p, _), a in listening_sockets().items() if a == f"127.0.0.1:{port}"}
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not fleet.down() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fleet.down() == [url]
        fleet.restart([url])  # same node, same port: healthy again
        assert fleet.down() == [] and fleet.urls == [url]
        assert "restarted by agentrl" in fleet.procs[0].tail()
    assert not any(a.endswith(f":{port}") for a in listening_sockets().values())

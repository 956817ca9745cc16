"""e2e fixtures: one local Ray shared by the tests that train.

Starting Ray takes 7-9 s on a 2-core machine; every `train()` used to start and stop its own.
`shared_ray` starts one before a test when none runs, and `train()` joins it (open_run stops only
a Ray it started itself). A test that needs a Ray of its own (workers with another environment, a
multi-node cluster, the GPUs it hands out) stops it first and is marked `own_ray`: those run after
every other e2e test, so the shared Ray starts once instead of again after each of them.

`scratch_devserver` is one dev server (session) for the tests that change what a server serves
(LoRA adapters, the prefix cache, pushed weights) where the session's `devserver` must keep its
weights: a server start (4-5 s here) once instead of once per module and per sync method. Its
users leave it as they found it where they can, and never assume more than it serves some weights.
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
from readme_kit import readme_add_env

from agentrl.engine import EngineClient
from agentrl.learner import RayConfig
from agentrl.learner.ray_start import start_ray, stop_ray

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The e2e tests marked `own_ray` last among the e2e tests (each keeps its place otherwise)."""
    slots = [i for i, item in enumerate(items) if Path(item.path).resolve().is_relative_to(HERE)]
    e2e = sorted(
        (items[i] for i in slots), key=lambda it: it.get_closest_marker("own_ray") is not None
    )
    for i, item in zip(slots, e2e, strict=True):
        items[i] = item


@pytest.fixture(scope="session")
def _ray_session():
    yield
    stop_ray()


@pytest.fixture
def shared_ray(_ray_session):
    start_ray(RayConfig())  # what a run with the default config starts
    yield


@pytest.fixture(scope="session")
def scratch_devserver(tiny_model_dir, launch_devserver):
    """URL of a session-wide dev server of the tiny model whose weights, adapters and cache the
    tests may change. Its gloo end (weight pushes over a group) binds loopback, as a fleet's does."""
    with ExitStack() as stack:
        with pytest.MonkeyPatch.context() as mp:  # the server's environment only, not the tests'
            mp.setenv("GLOO_SOCKET_IFNAME", "lo")
            url, _ = stack.enter_context(launch_devserver(tiny_model_dir))
        yield url


@pytest.fixture(scope="module")
def scratch_base_server(scratch_devserver, tiny_model_dir):
    """`scratch_devserver` serving the tiny model's own weights again (version "0"), for a module
    whose checks start from them, whatever the module before pushed."""

    async def serve_base() -> None:
        async with EngineClient([scratch_devserver]) as engine:
            await engine.control.update_weights_from_disk(str(tiny_model_dir), weight_version="0")

    asyncio.run(serve_base())
    return scratch_devserver


@pytest.fixture
def readme_env(tmp_path, monkeypatch):
    """The README's AddEnv saved as my_env.py in the test's dir and importable: its target."""
    (tmp_path / "my_env.py").write_text(readme_add_env())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_env.AddEnv"
    sys.modules.pop("my_env", None)

"""e2e fixtures: one local Ray shared by the tests that train.

Starting Ray takes 7-9 s on a 2-core machine; every `train()` used to start and stop its own.
`shared_ray` starts one before a test when none runs, and `train()` joins it (open_run stops only
a Ray it started itself). A test that needs a Ray of its own (workers with another environment, a
multi-node cluster, the GPUs it hands out) stops it first and is marked `own_ray`: those run after
every other e2e test, so the shared Ray starts once instead of again after each of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from readme_kit import readme_add_env

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


@pytest.fixture
def readme_env(tmp_path, monkeypatch):
    """The README's AddEnv saved as my_env.py in the test's dir and importable: its target."""
    (tmp_path / "my_env.py").write_text(readme_add_env())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_env.AddEnv"
    sys.modules.pop("my_env", None)

"""e2e fixtures: one local Ray shared by the tests that train.

Starting Ray takes 7-9 s on a 2-core machine; every `train()` used to start and stop its own.
`shared_ray` starts one before a test when none runs, and `train()` joins it (open_run stops only
a Ray it started itself). A test that needs a Ray of its own (workers with another environment, a
multi-node cluster) stops it first; the next test that asks starts it again.
"""

from __future__ import annotations

import sys

import pytest
from readme_kit import readme_add_env

from agentrl.learner import RayConfig
from agentrl.learner.ray_start import start_ray, stop_ray


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

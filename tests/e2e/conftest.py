"""e2e fixtures: one local Ray shared by the tests that train.

Starting Ray takes 7-9 s on a 2-core machine; every `train()` used to start and stop its own.
`shared_ray` starts one before a test when none runs, and `train()` joins it (open_run stops only
a Ray it started itself). A test that needs a Ray of its own (workers with another environment, a
multi-node cluster) stops it first; the next test that asks starts it again.
"""

from __future__ import annotations

import pytest

from agentrl.learner import RayConfig
from agentrl.learner.group import start_ray, stop_ray


@pytest.fixture(scope="session")
def _ray_session():
    yield
    stop_ray()


@pytest.fixture
def shared_ray(_ray_session):
    start_ray(RayConfig())  # what a run with the default config starts
    yield

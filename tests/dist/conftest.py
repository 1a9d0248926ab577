"""The local Ray cluster the dist tests share (module-scoped: one ray.init per test file)."""

import pytest


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024**2, log_to_driver=False)
    yield
    ray.shutdown()

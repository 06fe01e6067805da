"""The data preps' embedded Ray (recipes/dataprep/cluster.py, `backend: ray`): a start that misses Ray's fixed 30 s node
registration (a busy machine) is tried once more, with a real Ray."""

from __future__ import annotations

import pytest

from recipes.dataprep import cluster

pytestmark = [pytest.mark.heavy]

SLOW = "The current node timed out during startup. This could happen because some of the raylet failed to startup."


def test_a_local_ray_that_missed_its_registration_is_started_again(monkeypatch, capsys):
    real, calls = cluster.Cluster._init, []

    def first_one_late(self, ray):
        calls.append(1)
        real(self, ray)  # a real Ray, half up: the retry must end it before starting the next
        if len(calls) == 1:
            raise Exception(SLOW)

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster.Cluster, "_init", first_one_late)
    with cluster.Cluster("ray", object_store_mb=80) as c:
        ray = c.start()
        assert ray.get(ray.remote(lambda: 6 * 7).remote()) == 42
    assert len(calls) == 2
    assert "the local Ray did not register its node within Ray's own limit (a busy machine?); starting it again " \
           "(2/2)" in capsys.readouterr().err


def test_a_second_late_start_is_the_one_line_error(monkeypatch):
    calls = []

    def always_late(self, ray):
        calls.append(1)
        raise Exception(SLOW)

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster.Cluster, "_init", always_late)
    with pytest.raises(cluster.ClusterError) as err:
        cluster.Cluster("ray").start()
    assert len(calls) == cluster.STARTS == 2
    assert str(err.value) == f"cannot start a local Ray: Exception: {SLOW}"

"""On real Ray: a job's actor publishing series under raylens' names is not believed.

Any job can set ``ray.util.metrics`` gauges with raylens' names, labels included (here it
copies the real sampler's id), and the node's agent serves them beside the real sampler's.
A reader that believes only the samplers raylens started, each under the Ray worker id its
series carry, reads the real sampler's figures and refuses the forger's, counting it.
Inside the full suite the session's cluster may still serve samplers that earlier tests
stopped; those are refused as unknown beside the forger. The module starts its own
one-node Ray reporting every second, unless Ray is already connected (then it uses that
one).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from raylens.distributed.group_memory_sampler import GroupMemorySamplers  # noqa: E402
from raylens.telemetry.raylet_payload import read_sampler_series  # noqa: E402

HERE = Path(__file__).resolve().parent
MB = 2**20
DEADLINE_S = 90.0
#: How the forger's group series reads on the endpoint.
FORGED_SERIES = b'rl_worker_group="forged"'


class Forger:
    """A job's actor that publishes under raylens' names, posing as a sampler."""

    def publish(self, sampler: str) -> bool:
        from ray.util.metrics import Gauge

        self.gauges = (
            Gauge("raylens_worker_group_memory_bytes", tag_keys=("rl_worker_group", "memory_type")),
            Gauge("raylens_sampler_sampled_at_seconds", tag_keys=()),
            Gauge(
                "raylens_sampler_growth_window_seconds", tag_keys=("rl_sampler", "rl_started_by")
            ),
        )
        memory, stamp, window = self.gauges
        memory.set(1e9, tags={"rl_worker_group": "forged", "memory_type": "rss"})
        window.set(600.0, tags={"rl_sampler": sampler, "rl_started_by": "someone/1"})

        def keep_fresh() -> None:
            # A forger keeps publishing, as a sampler does: a stamp left alone goes stale
            # and would be dropped for that alone, however slowly the endpoint came round.
            while True:
                stamp.set(time.time() + 20.0)  # fresher than the real one, within the skew
                time.sleep(0.5)  # the forger's own publishing pace

        threading.Thread(target=keep_fresh, daemon=True).start()
        return True


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    started_here = not ray.is_initialized()
    if started_here:
        # The workers import this module (the forger) and raylens as the driver does.
        paths = [str(HERE), *(os.path.abspath(p) for p in sys.path if p and os.path.isdir(p))]
        ray.init(
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
            address="local",  # a Ray of its own, never one another process runs
            num_cpus=2,
            object_store_memory=80 * MB,
            include_dashboard=False,
            _system_config={"metrics_report_interval_ms": 1000},
        )
    try:
        node_id = ray.get_runtime_context().get_node_id()
        (node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
        yield f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    finally:
        if started_here:
            ray.shutdown()


def _payload(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def test_a_jobs_actor_posing_as_a_sampler_is_not_believed(url: str) -> None:
    node_id = ray.get_runtime_context().get_node_id()
    samplers = GroupMemorySamplers(sample_interval_s=0.5, ping_every=1)
    # On the sampler's node: a forger elsewhere would publish on another node's endpoint.
    on_this_node = NodeAffinitySchedulingStrategy(node_id, soft=False)
    forger = ray.remote(num_cpus=0)(Forger).options(scheduling_strategy=on_this_node).remote()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:  # until the driver knows its sampler's worker id (asked with its pings)
            errors = samplers.maintain({}, nodes={node_id})  # expected while it starts
            ours = samplers.sampler_ids()
            if len(ours) == 1 and all(ours.values()):
                break
            assert time.monotonic() < deadline, f"no worker id: {ours} {errors}"
            time.sleep(1.0)  # the next maintenance cycle, at a monitor's pace
        (actor_id,) = ours
        assert ray.get(forger.publish.remote(actor_id), timeout=60)
        while True:  # until both publishers' series are served
            payload = _payload(url)
            believed = read_sampler_series(payload, now=time.time(), trusted=ours)
            if FORGED_SERIES in payload and believed.figures and believed.figures.node:
                break
            assert time.monotonic() < deadline, "the endpoint never served both publishers"
            time.sleep(0.5)  # polling a served endpoint at its report pace

        assert [g.group for g in believed.figures.groups] == []
        assert believed.figures.node.sampler == actor_id
        # The forger, claiming our sampler's id from another worker. Samplers that earlier
        # monitors stopped may still be served beside it (Ray keeps a dead worker's last
        # values a while): those are refused too, as unknown, and counted with it.
        forged = [named for named in believed.refused if actor_id in named]
        assert len(forged) == 1 and forged[0].endswith("(not its worker)"), believed.refused
        assert believed.unknown >= 1
    finally:
        samplers.close()
        ray.kill(forger)

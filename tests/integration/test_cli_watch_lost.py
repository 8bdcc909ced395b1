"""`raylens watch` against a real Ray cluster that is shut down under it.

The cluster is the test's own (one head node), not the session's: it is shut down
while `raylens watch` runs, and the watch must end in one line with status 2 before
Ray's own client would end it (a minute after its GCS went away).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _give_the_session_its_key_value_client_back() -> None:
    """``Cluster.shutdown`` resets Ray's one key-value client for the whole process, the
    session cluster's connection included; the tests after this one publish through it."""
    import ray
    from ray._private import worker
    from ray.experimental import internal_kv

    if ray.is_initialized():
        internal_kv._initialize_internal_kv(worker.global_worker.gcs_client)


def test_watch_of_a_cluster_shut_down_under_it_exits_2_within_30_s_in_one_line() -> None:
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": 80 * 1024 * 1024,
            "include_dashboard": False,
        },
    )
    watch = None
    try:
        watch = subprocess.Popen(
            [
                *(sys.executable, "-m", "raylens", "watch", "--address", cluster.address),
                *("--json", "--interval", "1"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        records: list[dict[str, Any]] = []
        answered = threading.Event()

        def read() -> None:
            assert watch is not None and watch.stdout is not None
            for line in watch.stdout:
                record = json.loads(line)
                records.append(record)
                if record["nodes"] and all(node["error"] is None for node in record["nodes"]):
                    answered.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert answered.wait(120), "the watch never showed the cluster's node"
        cluster.shutdown()
        shut_down = time.monotonic()  # the cluster is gone from here on
        try:
            status = watch.wait(timeout=60)
        except subprocess.TimeoutExpired:
            watch.kill()
            pytest.fail("the watch did not end within 60 s of the cluster's shutdown")
        took = time.monotonic() - shut_down
        reader.join(10)
        assert watch.stderr is not None
        err = watch.stderr.read()
    finally:
        if watch is not None and watch.poll() is None:
            watch.kill()
            watch.wait()
        cluster.shutdown()
        _give_the_session_its_key_value_client_back()

    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert took < 30.0, f"took {took:.1f} s: {err}"
    print(f"the watch ended {took:.1f} s after the cluster's shutdown")
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "gave up after 30 s" in lines[0] and "has not answered since" in lines[0], err
    failing = [record for record in records if record["unreachable"]]
    assert failing, records[-3:]
    assert all(node["error"] == "cluster unreachable" for node in failing[-1]["nodes"])

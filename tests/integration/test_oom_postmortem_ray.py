"""OOM post-mortems on real Ray: Ray's memory monitor kills a ``policy`` worker, raylens writes it up.

Ray's path runs ``oom_driver.py`` in a process of its own: a one-node Ray whose
``memory_usage_threshold`` sits 3 GiB above the memory in use (room for Ray itself), with a 100 ms memory
monitor; a ``policy`` worker allocates past it and is killed. Within two monitor
intervals of the failed call a post-mortem naming ``policy`` is written, and
``rl.host.oom_kills`` counts the kill once (Ray's counter and the worker's
``OutOfMemoryError`` are one kill).

The kernel's path needs a cgroup v2 ``memory.max`` that this process may set (root on
a cgroup v2 machine); elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(300)
def test_a_policy_worker_killed_by_rays_memory_monitor_leaves_one_post_mortem(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(HERE / "oom_driver.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    print({k: v for k, v in summary.items() if k != "postmortems"})
    assert summary["error"] == "OutOfMemoryError"
    named = [p for p in summary["postmortems"] if p["victim"]["group"] == "policy"]
    assert named, summary["postmortems"]
    assert named[0]["killer"] == "ray" and named[0]["node_id"] == summary["node_id"]
    # The node's memory up to the kill, from the history the node's sampler keeps.
    assert named[0]["node_used"] is not None and len(named[0]["node_used"]["samples"]) >= 3
    assert summary["postmortem_after_s"] <= 2 * summary["interval_s"]
    assert summary["counter"] == {f"{summary['node_id']}/ray": len(summary["postmortems"])}


def _cgroup_v2_writable() -> str | None:
    """Why the kernel's path cannot run here, or None when it can."""
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return "this machine has no cgroup v2 hierarchy at /sys/fs/cgroup"
    if os.geteuid() != 0:
        return "setting a cgroup's memory.max needs root"
    controllers = Path("/sys/fs/cgroup/cgroup.subtree_control").read_text()
    if "memory" not in controllers.split():
        return "the memory controller is not enabled for child cgroups"
    return None


@pytest.mark.timeout(120)
def test_a_kernel_oom_kill_in_a_cgroup_is_counted_where_the_machine_allows_it(
    tmp_path: Path,
) -> None:
    why = _cgroup_v2_writable()
    if why is not None:
        pytest.skip(f"the kernel's OOM path needs a cgroup v2 memory.max as root: {why}")
    from raylens.telemetry.oom import read_kernel_oom_count

    group = Path("/sys/fs/cgroup") / f"raylens-oom-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.max").write_text(str(64 * 2**20))
        (group / "memory.swap.max").write_text("0")
        before = read_kernel_oom_count(cgroup_root=str(group))
        assert before is not None
        # Moved into the group while it sleeps, it then allocates past memory.max.
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(1); b = bytearray(256 * 2**20)"]
        )
        (group / "cgroup.procs").write_text(str(child.pid))
        assert child.wait(timeout=60) != 0
        after = read_kernel_oom_count(cgroup_root=str(group))
        assert after is not None and after.kills == before.kills + 1
    finally:
        group.rmdir()

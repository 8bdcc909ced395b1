"""OOM post-mortems on real Ray: every worker Ray's memory monitor kills is written up.

Ray's path runs ``oom_driver.py`` in a process of its own: a one-node Ray whose
``memory_usage_threshold`` sits 2.5 GiB above the memory in use, ``policy`` and
``rollout`` groups sharing one bundle, telemetry started as a job starts it, and the
driver inside ``raylens.phase("train")`` fetching with a plain ``ray.get`` while
``policy`` allocates past the threshold. Every victim the raylet's own counter names
(read from the node's endpoint) is in a post-mortem with ``"phase": "train"``, the one
naming ``policy`` lists the node's largest processes, raylens' sampler is not among the
victims, and no traceback reaches the driver's log but those of the processes Ray
ends with SIGTERM (see :mod:`driver_log`).

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
from driver_log import unexplained_tracebacks

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(300)
def test_every_worker_rays_memory_monitor_kills_is_in_a_post_mortem_of_its_phase(
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
    assert "timeout" not in summary, summary
    victims = summary["raylet_victims"]
    postmortems = summary["postmortems"]
    named = {v["ray_name"] for p in postmortems for v in p["victims"]}
    assert set(victims) <= named
    assert any(name.startswith("policy-") for name in victims)
    assert not any("GroupMemorySamplerActor" in name for name in victims)
    assert all(p["phase"] == "train" and p["killer"] == "ray" for p in postmortems)
    (policy,) = [p for p in postmortems if any(v["group"] == "policy" for v in p["victims"])]
    assert policy["largest_processes"] and not policy["sampler_killed"]
    assert policy["node_id"] == summary["node_id"]
    assert policy["worker_groups"] and policy["node_used"] is not None
    assert summary["counter"] == {f"{summary['node_id']}/ray": sum(victims.values())}
    assert summary["modes"] == ["0o600"]
    assert not unexplained_tracebacks(done.stderr), done.stderr[-4000:]


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

"""The example drivers on real Ray: labelled host-memory points within seconds, nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

_ROOT = Path(__file__).resolve().parents[2]
_EXAMPLES = _ROOT / "examples"
_GROUPS_ATTR = 'rl.worker_groups="'


def _descendants(pid: int) -> dict[psutil.Process, str]:
    """Every live descendant of ``pid`` and its process name."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    named = {}
    for child in children:
        try:
            named[child] = child.name()
        except psutil.Error:
            continue
    return named


def _run_watching_descendants(
    command: list[str], env: dict[str, str], timeout: float
) -> tuple[subprocess.Popen, str, dict[psutil.Process, str]]:
    """Run ``command``, noting every process it starts (Ray re-parents them when it exits)."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=_ROOT,
    )
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(process.stdout.read()))
    reader.start()
    seen: dict[psutil.Process, str] = {}
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        seen.update(_descendants(process.pid))
        time.sleep(0.2)
    if process.poll() is None:
        process.kill()
    process.wait()
    reader.join(30)
    return process, "".join(chunks), seen


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _still_running(processes: dict[psutil.Process, str], timeout: float = 30.0) -> list[str]:
    """Those of ``processes`` still running after ``timeout`` s (a reused pid does not count)."""
    deadline = time.monotonic() + timeout
    alive = {p for p in processes if _running(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = {p for p in alive if _running(p)}
    return sorted(f"{process.pid} {processes[process]}" for process in alive)


def _worker_groups_of_used_points(output: str) -> list[str]:
    labels = []
    for line in output.splitlines():
        if line.startswith("rl.host.memory.used{") and _GROUPS_ATTR in line:
            labels.append(line.split(_GROUPS_ATTR, 1)[1].split('"', 1)[0])
    return labels


@pytest.mark.parametrize(
    ("script", "groups"),
    [("driver.py", {"policy", "rollout"}), ("own_groups.py", {"trainer", "samplers"})],
)
def test_an_example_prints_points_labelled_with_its_groups_and_stops_ray(
    script: str, groups: set[str]
) -> None:
    pytest.importorskip("ray")
    env = dict(os.environ, RAYLENS_EXPORTER="console", OTEL_METRIC_EXPORT_INTERVAL="1000")
    env.pop("RAY_ADDRESS", None)  # the example must start its own Ray, not join one
    process, output, started = _run_watching_descendants(
        [sys.executable, str(_EXAMPLES / script), "--duration", "4"], env, timeout=240
    )
    assert process.returncode == 0, output
    labels = _worker_groups_of_used_points(output)
    labelled = [label for label in labels if groups & set(label.split(","))]
    assert labelled, f"no rl.host.memory.used point labelled with a group in:\n{output}"
    assert "raylet" in started.values(), f"the example started no Ray of its own:\n{output}"
    assert _still_running(started) == [], "Ray processes outlived the example"

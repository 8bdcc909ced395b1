"""Every query of the shipped dashboard, alert rules and PromQL guide returns series from a real
Prometheus that scrapes raylens.

Prometheus scrapes three raylens processes on 127.0.0.1, each with the Prometheus exporter:

- ``raylens simulate`` (host memory per node, worker-group labels, a hung node);
- ``raylens profile -- sleep`` (a live process tree and the profiler's host);
- a feeder that this file runs as a script: a simulated node above 90% of its memory and
  growing towards its kill line, a reading of memory per worker group, a profiled server
  whose process is gone, a worker killed for memory and an ended phase, so the alert
  expressions, the per-group, growth, phase and kill panels have something to show.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
PROMETHEUS = shutil.which("prometheus")
GIB = 1024**3
DEADLINE_S = 45.0


def _load_dashboard_helpers() -> Any:
    spec = importlib.util.spec_from_file_location(
        "raylens_dashboard_checks", HERE.parent / "unit" / "test_dashboards.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _load_dashboard_helpers()


# ------------------------------------------------------------------------- the feeder


def feed(port: int) -> None:
    """Export, on ``127.0.0.1:port``, what ``raylens simulate`` and ``profile`` do not show.

    Runs until its standard input closes, then stops everything it started.
    """
    from raylens.lens import TelemetryConfig, init_telemetry, shutdown_telemetry
    from raylens.telemetry import host_memory
    from raylens.telemetry.group_memory import (
        DEFAULT_SNAPSHOT,
        GroupMemory,
        NodeGroupMemory,
        register_group_memory_gauges,
    )
    from raylens.telemetry.growth_outlook import GrowthSnapshot, NodeOutlook, register_growth_gauges
    from raylens.telemetry.oom import Killer, OomLedger, register_oom_counter
    from raylens.telemetry.phases.memory import (
        GroupPhaseMemory,
        NodePhaseMemory,
        PhaseMemoryTable,
        PhaseRecord,
        register_phase_gauges,
    )
    from raylens.telemetry.process_memory import MemoryProfiler, ServerMemoryTarget
    from raylens_fakes.simulated import SimulatedCluster

    def memory(index: int, _t: float) -> tuple[float, float]:
        return (0.95 if index == 0 else 0.5) * 64 * GIB, 64.0 * GIB

    init_telemetry(TelemetryConfig(exporter="prometheus", prometheus_addr=f"127.0.0.1:{port}"))
    live = subprocess.Popen(["sleep", "300"])
    gone = subprocess.Popen(["sleep", "300"])
    try:
        targets = [
            ServerMemoryTarget("policy-server", "model", live.pid),
            ServerMemoryTarget("env-server", "resources", gone.pid),
        ]
        gone.kill()
        gone.wait()
        with SimulatedCluster(2, schedule=memory) as simulated:
            nodes = simulated.node_ids
            host_memory.register_worker_group_nodes("policy", nodes[:1])
            host_memory.register_worker_group_nodes("rollout", nodes[1:])
            register_group_memory_gauges()
            DEFAULT_SNAPSHOT.publish(
                {
                    node: NodeGroupMemory(
                        simulated.hostname(index),
                        (GroupMemory(group, 3 * GIB, 2 * GIB, 0.0, 3, 1),),
                    )
                    for index, (node, group) in enumerate(zip(nodes, ("policy", "rollout")))
                },
                max_age=3600,
            )
            growth = GrowthSnapshot()
            register_growth_gauges(growth)
            growth.publish(
                NodeOutlook(
                    node_id=node,
                    host=simulated.hostname(index),
                    worker_groups=group,
                    used=(0.95 if index == 0 else 0.5) * 64 * GIB,
                    growth=(1e7 if index == 0 else 0.0),
                    growing=index == 0,
                    limit=0.97 * 64 * GIB,
                    time_to_limit=(0.02 * 64 * GIB / 1e7) if index == 0 else None,
                    fastest_group=group if index == 0 else None,
                    group_growth={group: 1e7 if index == 0 else 0.0},
                )
                for index, (node, group) in enumerate(zip(nodes, ("policy", "rollout")))
            )
            kills = OomLedger()
            kills.count(nodes[0], Killer.RAY)
            register_oom_counter(kills)
            phases = PhaseMemoryTable()
            register_phase_gauges(phases)
            peak = GroupPhaseMemory("policy", 2 * GIB, 3 * GIB, 4 * GIB, "kernel")
            phases.record(
                PhaseRecord(
                    "generation",
                    duration_s=12.5,
                    ended_at=time.time(),
                    nodes={nodes[0]: NodePhaseMemory(simulated.hostname(0), (peak,))},
                )
            )
            monitor = host_memory.HostMemoryMonitor(
                1.0, cluster=simulated.cluster, scrape_mode="inprocess", consumer=True
            )
            profiler = MemoryProfiler(targets, 1.0)
            monitor.start()
            profiler.start()
            try:
                sys.stdin.read()
            finally:
                profiler.stop()
                monitor.stop()
                shutdown_telemetry()
    finally:
        for process in (live, gone):
            process.kill()
            process.wait()


# ------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _poll(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


def _end(process: subprocess.Popen, how: Callable[[], None]) -> None:
    """End ``process`` with ``how``, then its whole session if anything is left."""
    if process.poll() is None:
        with contextlib.suppress(OSError):
            how()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=15)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _exported(port: int) -> bool:
    try:
        return "target_info" in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except requests.RequestException:
        return False


@pytest.fixture
def raylens_targets(tmp_path: Path) -> Iterator[list[int]]:
    """Three raylens processes exporting to Prometheus; yields their ports."""
    raylens = [sys.executable, "-m", "raylens"]
    exporter = "--exporter prometheus"
    simulate = f"simulate {exporter} --nodes 4 --hung 1 --interval 1 --json --duration 120"
    profile = f"profile {exporter} --interval 1 -- sleep 120"
    feeder = "import sys, test_dashboard_prometheus as t; t.feed(int(sys.argv[1]))"
    commands = [
        [*raylens, *simulate.split()],
        [*raylens, *profile.split()],
        [sys.executable, "-c", feeder],
    ]
    started: list[tuple[subprocess.Popen, int]] = []
    try:
        for index, command in enumerate(commands):
            port = _free_port()
            env = dict(
                os.environ,
                RAYLENS_PROMETHEUS_ADDR=f"127.0.0.1:{port}",
                PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            )
            if command[1] == "-c":
                command = [*command, str(port)]
            with (tmp_path / f"target-{index}.err").open("wb") as errors:
                process = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    start_new_session=True,
                )
            started.append((process, port))
        for index, (process, port) in enumerate(started):
            _poll(
                lambda p=process, n=port: _exported(n) or p.poll() is not None,
                30,
                f"the Prometheus endpoint of {process.args!r}",
            )
            if process.poll() is not None:
                errors = (tmp_path / f"target-{index}.err").read_text(errors="replace")
                pytest.fail(f"{process.args!r} ended early:\n{errors[-2000:]}")
        yield [port for _, port in started]
    finally:
        for process, _port in started:
            if process.args[1] == "-c":
                _end(process, process.stdin.close)
            else:
                _end(process, lambda p=process: p.send_signal(signal.SIGINT))


@pytest.fixture
def prometheus(raylens_targets: list[int], tmp_path: Path) -> Iterator[str]:
    """A Prometheus server scraping the targets every second; yields its API's base URL."""
    assert PROMETHEUS is not None
    rules = tmp_path / "raylens-alerts.yml"
    shutil.copyfile(checks.ALERT_RULES, rules)
    targets = ", ".join(f"'127.0.0.1:{port}'" for port in raylens_targets)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  evaluation_interval: 1s\n"
        f"rule_files: ['{rules}']\n"
        "scrape_configs:\n"
        "  - job_name: raylens\n"
        f"    static_configs: [{{targets: [{targets}]}}]\n"
    )
    web = f"127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address={web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield f"http://{web}/api/v1"
    finally:
        _end(server, server.terminate)


# ------------------------------------------------------------------------- the queries


def _get(url: str, params: dict[str, str]) -> Any:
    """The ``data`` of a Prometheus API answer; None when it did not answer."""
    try:
        return requests.get(url, params=params, timeout=3).json()["data"]
    except (requests.RequestException, ValueError, KeyError):
        return None


def _query(api: str, expr: str) -> list[dict[str, Any]]:
    """The series ``expr`` returns now; a query Prometheus rejects fails the test at once."""
    try:
        body = requests.get(f"{api}/query", params={"query": expr}, timeout=3).json()
    except (requests.RequestException, ValueError):
        return []
    assert body.get("status") == "success", f"Prometheus rejects {expr!r}: {body.get('error')}"
    return body["data"]["result"]


def _substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with every Grafana variable replaced as "All" would replace it."""
    return checks._VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], expr)


def _wanted_queries() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """Queries to run and ``(variable, query, regex)`` to list, pending series left out."""
    dashboard = checks.load_dashboard()
    variables = [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
    values = {v["name"]: v["allValue"] for v in variables}
    queries = [
        (where, _substitute(expr, values)) for where, expr in checks.dashboard_queries(dashboard)
    ]
    queries += [(f"alert {r['alert']}", r["expr"]) for r in checks.load_alert_rules()]
    queries += [
        (f"docs/dashboards.md example {number}", expr)
        for number, expr in enumerate(checks.guide_queries(), 1)
    ]
    listings = [(v["name"], v["query"]["query"], v.get("regex", "")) for v in variables]
    return queries, listings


def _variable_values(api: str, query: str, regex: str) -> list[str]:
    """What Grafana lists for a variable: label_values(...) or query_result(...) and its regex."""
    if query.startswith("query_result("):
        texts = [
            checks.query_result_text(series["metric"], float(series["value"][1]))
            for series in _query(api, checks.variable_promql(query))
        ]
        return checks.grafana_variable_values(regex, texts) if regex else texts
    selector, label = checks.label_values_args(query)
    return _get(f"{api}/label/{label}/values", {"match[]": selector}) or []


def _evaluated_rules(api: str) -> list[dict[str, Any]]:
    """The alerting rules Prometheus has evaluated at least once, without error."""
    data = _get(f"{api}/rules", {})
    return [
        rule
        for group in (data or {}).get("groups", [])
        for rule in group["rules"]
        if rule["health"] == "ok" and not rule["lastEvaluation"].startswith("0001-")
    ]


@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed")
def test_every_dashboard_alert_and_guide_query_returns_series(prometheus: str) -> None:
    queries, listings = _wanted_queries()
    assert len(queries) >= 20
    empty = dict(queries)

    def run_all() -> bool:
        for where, expr in list(empty.items()):
            if _query(prometheus, expr):
                del empty[where]
        return not empty

    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not run_all():
        time.sleep(0.5)
    assert not empty, "queries without series:\n" + "\n".join(
        f"  {where}: {expr}" for where, expr in empty.items()
    )

    # Every variable lists values, as Grafana would from its query and regex.
    for name, query, regex in listings:
        assert _variable_values(prometheus, query, regex), f"variable {name}: no values"

    # Prometheus loaded every alert rule, evaluates them without error, and each matches. A
    # rule first evaluated before its series arrived reads inactive until its next evaluation.
    rules = _poll(
        lambda: len(_evaluated_rules(prometheus)) == 4 and _evaluated_rules(prometheus),
        15,
        "every alert rule evaluated",
    )
    assert {rule["name"] for rule in rules} == {
        "RaylensNodeMemoryNearLimit",
        "RaylensServedProcessGone",
        "RaylensNodeReachesKillLineSoon",
        "RaylensWorkerKilledForMemory",
    }

    seen: list[Any] = []

    def matching() -> bool:
        seen[:] = [(r["name"], r["state"]) for r in _evaluated_rules(prometheus)]
        return all(state in ("pending", "firing") for _, state in seen)

    _poll(matching, 15, "every alert rule pending or firing")
    assert len(seen) == 4, seen

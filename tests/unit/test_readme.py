"""The README's promises: its examples run, its driver is the tested one, CI runs its commands."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

from raylens.cluster import use_cluster_view
from raylens.telemetry.host_memory import RL_HOST_MEMORY_USED_METRIC, HostMemoryMonitor

pytest_plugins = ["pytester"]

_ROOT = Path(__file__).resolve().parents[2]
_README = (_ROOT / "README.md").read_text(encoding="utf-8")


def _code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _README, flags=re.DOTALL)


def _python_block_with(marker: str) -> str:
    """The one python block, other than the example test, that contains ``marker``."""
    (block,) = [
        block for block in _code_blocks("python") if marker in block and "def test_" not in block
    ]
    return block


@pytest.mark.slow
def test_the_example_test_in_the_readme_passes(pytester: pytest.Pytester) -> None:
    (example,) = [block for block in _code_blocks("python") if "def test_" in block]
    pytester.makepyfile(test_readme_example=example)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    run_command, test_command = (block.strip() for block in _code_blocks("bash")[:2])
    assert "raylens demo" in run_command
    ci_script = (_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci_script.splitlines()


def test_the_readme_driver_is_the_example_driver_the_integration_suite_runs() -> None:
    source = (_ROOT / "examples" / "driver.py").read_text(encoding="utf-8")
    (run,) = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "run"
    ]
    block = _python_block_with("RayVirtualCluster(")
    assert ast.get_source_segment(source, run) in block
    imports = [line for line in block.splitlines() if line.startswith(("import ", "from "))]
    assert imports
    assert [line for line in imports if line not in source.splitlines()] == []
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.parse(block).body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    names = [node for node in ast.walk(run) if isinstance(node, ast.Name)]
    bound = {node.id for node in names if isinstance(node.ctx, ast.Store)}
    bound |= {argument.arg for argument in run.args.args}
    read = {node.id for node in names if isinstance(node.ctx, ast.Load)}
    assert read - bound - imported - set(dir(builtins)) == set()


def _labels(monitor: HostMemoryMonitor, metrics_probe, sim) -> list[str]:
    """Each node's ``rl.worker_groups`` label after one collection, by node index."""
    monitor.collect_once()
    by_node = {
        dict(attributes)["ray.node.id"]: dict(attributes)["rl.worker_groups"]
        for attributes in metrics_probe.points(RL_HOST_MEMORY_USED_METRIC)
    }
    return [by_node.get(sim.node_id(index), "no point") for index in range(len(sim))]


@pytest.mark.slow
def test_the_readme_own_group_labels_its_nodes_until_it_shuts_down(
    simulated_cluster, metrics_probe, raylens_state
) -> None:
    namespace: dict[str, object] = {}
    exec(compile(_python_block_with("class TrainerGroup"), "README.md", "exec"), namespace)
    sim = simulated_cluster(3)
    placement_group = sim.cluster.create_placement_group({0: sim.node_id(0), 1: sim.node_id(1)})

    with use_cluster_view(sim.cluster):
        monitor = HostMemoryMonitor(1.0, scrape_timeout=5.0)
        try:
            group = namespace["TrainerGroup"]("trainer", placement_group)
            while_up = _labels(monitor, metrics_probe, sim)
            group.shutdown()
            after = _labels(monitor, metrics_probe, sim)
        finally:
            monitor.stop()

    assert while_up == ["trainer", "trainer", "none"]
    assert after == ["none", "none", "none"]

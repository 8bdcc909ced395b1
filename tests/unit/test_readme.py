"""The README's promises: its examples run, its driver is the tested one, CI runs its commands."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path
from typing import Any

# Imported here, before any in-process pytester run: such a run unloads the modules it
# imported, and numpy's extension cannot be loaded a second time in one process.
import numpy  # noqa: F401
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


# ------------------------------------------------------------------ what the README says


def _table_after(heading: str, header: str) -> list[list[str]]:
    """The rows of the first table under ``heading`` whose header line starts with ``header``."""
    section = _README[_README.index(heading) :]
    lines = section[section.index(header) :].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _subcommands() -> dict[str, Any]:
    import argparse

    from raylens.cli.parser import build_parser

    (commands,) = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return dict(commands.choices)


def test_the_commands_table_lists_every_command_and_every_flag_of_its_help() -> None:
    rows = _table_after("## The commands", "| command | what it does |")
    usages = {}
    for usage, _what in rows:
        match = re.fullmatch(r"`raylens (\w+)(.*)`", usage)
        assert match, f"not a command usage: {usage}"
        usages[match.group(1)] = match.group(2)
    commands = _subcommands()
    assert set(usages) == set(commands)
    for name, usage in usages.items():
        parser = commands[name]
        documented = set(re.findall(r"\[(-{1,2}[a-z][a-z-]*)", usage))
        flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
        missing = [a.option_strings for a in flags if not documented & set(a.option_strings)]
        assert not missing, f"raylens {name}: the README leaves out {missing}"
        known = {option for action in flags for option in action.option_strings}
        assert documented <= known, f"raylens {name}: no such flags {documented - known}"
        # A default shown in the README is the one the command has.
        for flag, value in re.findall(r"\[(--[a-z-]+) (\d+(?:\.\d+)?)\]", usage):
            (action,) = [a for a in parser._actions if flag in a.option_strings]
            assert float(value) == action.default, f"raylens {name} {flag}: default"
        help_text = parser.format_help()
        assert all(flag in help_text for flag in documented), name


def test_the_performance_table_quotes_docs_performance() -> None:
    performance = (_ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    rows = _table_after("## Performance", "| benchmark |")
    assert rows
    for benchmark, *figures, _ratio in rows:
        for number in re.findall(r"\d[\d,]*(?:\.\d+)?", " ".join([benchmark, *figures])):
            assert re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d,])", performance), (
                f"{number} (README performance row {benchmark!r}) is not in docs/performance.md"
            )


def _plain_code_blocks() -> list[str]:
    """The README's fenced blocks that name no language."""
    blocks: list[str] = []
    current: list[str] | None = None
    plain = False
    for line in _README.splitlines():
        if line.startswith("```"):
            if current is None:
                current, plain = [], line == "```"
            else:
                if plain:
                    blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_the_table_samples_show_the_columns_and_summary_of_todays_table() -> None:
    from raylens.live_table import _NODE_COLUMNS

    samples = [block for block in _plain_code_blocks() if "┃ node" in block]
    assert len(samples) == 2
    for sample in samples:
        lines = sample.strip().splitlines()
        header = [cell.strip() for cell in lines[2].strip("┃").split("┃")]
        columns = [name for name, _options in _NODE_COLUMNS]
        assert header == [name for name in columns if name in header]
        assert {"node", "used", "total", "used %", "worker groups"} <= set(header)
        assert re.fullmatch(
            r"\d+ nodes? on \d+ hosts?, \d+ failing, [\d.]+ \w+ of [\d.]+ \w+ used \([\d.]+%\)",
            lines[-1],
        ), lines[-1]

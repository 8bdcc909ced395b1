"""What a new user meets first: one-line flag errors, honest totals and plurals, whole values."""

from __future__ import annotations

import json
import sys
import threading
import types
from typing import Any

import pytest

from raylens.cli import main
from raylens.cli.parser import MAX_SECONDS, build_parser
from raylens.live_table import NodeRow, ProcessTreeRow, node_summary

GIB = 1024**3


# ---------------------------------------------------------------- flag errors


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--interval", "0"],
        ["watch", "--address", "foo"],
        ["profile", "--json", "--pss-interval", "x", "--", "true"],
        ["demo", "--nodes", "1"],
        ["nonsense"],
    ],
)
def test_a_flag_error_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("raylens") and "error:" in lines[0] and "--help" in lines[0]


@pytest.mark.parametrize("command", ["simulate", "watch", "demo", "profile"])
def test_verbose_is_taken_before_or_after_the_command(command: str) -> None:
    parser = build_parser()
    assert parser.parse_args([command, "-v"]).verbose is True
    assert parser.parse_args(["-v", command]).verbose is True
    assert parser.parse_args([command, "--verbose"]).verbose is True
    assert parser.parse_args([command]).verbose is False


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["watch", "--duration", "1e10"], "--duration"),
        (["simulate", "--interval", "1e300"], "--interval"),
        (["profile", "--pss-interval", "1e12", "--", "true"], "--pss-interval"),
    ],
)
def test_a_bound_in_seconds_is_a_documented_one(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert f"argument {flag}" in err
    assert f"at most {MAX_SECONDS} s (365 days)" in err
    assert "9223372036" not in err


def test_the_longest_allowed_duration_is_accepted() -> None:
    args = build_parser().parse_args(["watch", "--duration", str(MAX_SECONDS)])
    assert args.duration == MAX_SECONDS


# ---------------------------------------------------------------- --address


def _address_error(address: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["watch", "--address", address, "--once"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def test_an_address_without_a_port_suggests_the_gcs_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = _address_error("foo", capsys)
    assert "'foo'" in line and "6379" in line and "auto" in line
    assert "9464" not in line


@pytest.mark.parametrize("address", ["", "   "])
def test_an_empty_address_is_refused(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _address_error(address, capsys)
    assert "argument --address" in line and "empty" in line


@pytest.mark.parametrize(
    "address", ["this://127.0.0.1:1", "http://127.0.0.1:6379", "antigravity://x:1", "a\x1b://b:1"]
)
def test_only_ray_client_addresses_may_carry_a_scheme(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = set(sys.modules)
    line = _address_error(address, capsys)
    assert "HOST:PORT" in line and "auto" in line and "ray://" in line
    assert "\x1b" not in line
    assert {"this", "antigravity"} & (set(sys.modules) - before) == set()


@pytest.mark.parametrize("address", ["127.0.0.1:6379", "head-0:6380", "[::1]:6379", "auto"])
def test_plain_addresses_are_taken(address: str) -> None:
    assert build_parser().parse_args(["watch", "--address", address]).address == address


def test_a_ray_address_from_the_environment_goes_through_the_same_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raylens.cli import cluster_views
    from raylens.cli.parser import CliError

    def init(**kwargs: object) -> None:
        raise AssertionError("ray.init must not be reached")

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=init))
    monkeypatch.setenv("RAY_ADDRESS", "this://127.0.0.1:1")
    args = build_parser().parse_args(["watch", "--once"])
    with pytest.raises(CliError, match=r"RAY_ADDRESS='this://127\.0\.0\.1:1'.*HOST:PORT"):
        cluster_views.run_watch(args, threading.Event())
    assert "this" not in sys.modules


def test_the_reachability_check_refuses_a_scheme_it_does_not_know() -> None:
    from raylens.cli.gcs_probe import check_reachable
    from raylens.cli.parser import CliError

    with pytest.raises(CliError, match="HOST:PORT"):
        check_reachable("this://127.0.0.1:1")


# ---------------------------------------------------------------- totals per host


def test_nodes_that_share_a_host_count_its_memory_once() -> None:
    total = 23.5 * GIB
    rows = [
        NodeRow("a" * 16, "vm", 1.3 * GIB, total, "policy", 0.1),
        NodeRow("b" * 16, "vm", 1.4 * GIB, total, "policy", 0.2),
        NodeRow("c" * 16, "vm", 1.35 * GIB, total, "rollout", 0.3),
    ]
    summary = node_summary(rows)
    assert str(summary).startswith("3 nodes on 1 host, 0 failing, 1.4 GiB of 23.5 GiB used")
    totals = summary.to_json()
    assert totals["hosts"] == 1
    assert totals["total_bytes"] == round(total)
    assert totals["used_bytes"] == round(1.4 * GIB)


def test_hosts_are_counted_apart_and_failing_nodes_add_no_memory() -> None:
    rows = [
        NodeRow("a" * 16, "h1", 16 * GIB, 64 * GIB, "policy", 1.0),
        NodeRow("b" * 16, "h1", 16 * GIB, 64 * GIB, "policy", 1.0),
        NodeRow("c" * 16, "h2", 48 * GIB, 64 * GIB, "rollout", 1.0),
        NodeRow("d" * 16, "h3", None, None, "rollout", None, "timed out"),
    ]
    summary = node_summary(rows)
    assert str(summary) == "4 nodes on 3 hosts, 1 failing, 64.0 GiB of 128.0 GiB used (50.0%)"


def test_one_node_reads_in_the_singular() -> None:
    rows = [NodeRow("a" * 16, "h1", 1 * GIB, 4 * GIB, "policy", 1.0)]
    assert str(node_summary(rows)).startswith("1 node on 1 host, 0 failing")
    assert str(node_summary([])) == "0 nodes, 0 failing"


def test_the_simulate_title_reads_in_the_singular() -> None:
    from raylens.cli.cluster_views import simulate_title

    assert simulate_title(1, 0) == "Simulated cluster: 1 node, 0 hung"
    assert simulate_title(4, 1) == "Simulated cluster: 4 nodes, 1 hung"


def test_the_demo_describes_one_worker_in_the_singular() -> None:
    from raylens.demo import DemoCluster

    demo = DemoCluster(2, worker_megabytes=64)
    demo.groups = {
        "policy": types.SimpleNamespace(workers=[object()]),
        "rollout": types.SimpleNamespace(workers=[object(), object()]),
    }
    assert demo.describe().splitlines() == [
        "worker group 'policy': 1 worker holding 64 MiB",
        "worker group 'rollout': 2 workers holding 64 MiB each",
    ]


# ---------------------------------------------------------------- whole values in --json


def test_json_byte_counts_are_whole_numbers() -> None:
    row = NodeRow(
        "n1", "h", 34655811854.90223, 4.0e10, "policy", 0.5, group_rss={"policy": 1.5e6 + 0.25}
    )
    record = row.to_json()
    assert record["used_bytes"] == 34655811855 and isinstance(record["used_bytes"], int)
    assert isinstance(record["total_bytes"], int)
    assert record["worker_group_rss_bytes"] == {"policy": 1500000}
    totals = node_summary([row]).to_json()
    assert isinstance(totals["used_bytes"], int) and isinstance(totals["total_bytes"], int)
    assert ".9" not in json.dumps(record)

    tree = ProcessTreeRow("p", 1, 2, 3.5e6, 2.25e6, 1.0, 4.75e6, 2.5e6, kernel_peak=5e6)
    values = tree.to_json()
    for key in ("rss_bytes", "pss_bytes", "rss_peak_bytes", "pss_peak_bytes"):
        assert isinstance(values[key], int), key
    assert isinstance(values["kernel_peak_rss_bytes"], int)


def test_profile_json_keeps_the_whole_command() -> None:
    from raylens.cli.profile import ProcessTable

    label = "python -c " + "x" * 200
    server = types.SimpleNamespace(
        rss_bytes=1.0,
        pss_bytes=None,
        pss_age_seconds=None,
        process_count=1,
        peak_rss_bytes=1.0,
        peak_pss_bytes=None,
    )
    snapshot = types.SimpleNamespace(taken_at=0.0, servers=[server])
    profiler: Any = types.SimpleNamespace(latest=lambda: snapshot)
    table = ProcessTable(profiler, label=label, pid=1, clock=lambda: 0.0)
    (row,) = table.rows()
    assert row.to_json()["name"] == label

"""Node records from the GCS are untrusted: what is scraped, exported and logged from them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from raylens.telemetry import host_memory as hm
from raylens_fakes import FakeCluster

LOGGER = "raylens.telemetry.host_memory"
NODE_A = "a" * 56
NODE_C = "c" * 56
# Retitles a terminal (OSC), clears it (CSI), and an 8-bit CSI.
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m"


def _record(**fields: object) -> dict[str, object]:
    record: dict[str, object] = {
        "Alive": True,
        "NodeID": NODE_C,
        "NodeManagerAddress": "10.0.0.9",
        "NodeManagerHostname": "h",
        "MetricsExportPort": 8080,
    }
    record.update(fields)
    return record


def _cluster(*records: dict[str, object]) -> FakeCluster:
    cluster = FakeCluster()
    for record in records:
        cluster.add_raw_record(record)
    return cluster


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _refused_with_one_warning(record: dict[str, object], caplog: pytest.LogCaptureFixture) -> str:
    """The one warning a cluster holding only ``record`` gives, once it listed no node."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        nodes = hm.ray_nodes(_cluster(record), include_unscrapeable=True)

    assert nodes == []
    (warning,) = _warnings(caplog)
    assert warning.startswith("skipped a malformed Ray node record")
    return warning


def _has_control(text: str) -> bool:
    return any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in text)


def test_a_malformed_node_record_is_skipped_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeCluster()
    for record in (None, _record(NodeID=["unhashable"]), _record(NodeManagerAddress=10)):
        cluster.add_raw_record(record)
    good = cluster.add_node(address="10.0.0.1", port=8080, node_id=NODE_A)

    with caplog.at_level(logging.DEBUG, logger="raylens.telemetry.host_memory"):
        first = hm.ray_nodes(cluster)
        second = hm.ray_nodes(cluster)

    assert [n.node_id for n in first] == [good] == [n.node_id for n in second]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert all(w.startswith("skipped a malformed Ray node record") for w in warnings)


def test_host_names_are_made_encodable_where_they_enter() -> None:
    cluster = FakeCluster()
    cluster.add_raw_record(_record(NodeManagerHostname="gpu-\udcff"))

    (node,) = hm.ray_nodes(cluster)

    assert node.host == "gpu-\ufffd"
    node.host.encode("utf-8")


# Node ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "node_id",
    [f"abc{ESCAPES}def", "a" * 56 + "\u202e", "a\u200bb", "two words", "x" * 129, "é" * 10],
)
def test_a_node_id_that_is_not_a_plain_id_is_refused_and_logged_escaped(
    node_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = _cluster(_record(NodeID=node_id))
    good = cluster.add_node(address="10.0.0.1", port=8080, node_id=NODE_A)

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        nodes = hm.ray_nodes(cluster, include_unscrapeable=True)

    assert [n.node_id for n in nodes] == [good]
    (warning,) = _warnings(caplog)
    assert warning.startswith("skipped a malformed Ray node record")
    assert "NodeID" in warning
    assert not _has_control(warning)
    assert len(warning) < 1000


def test_an_escaped_node_id_never_reaches_the_monitors_log(
    make_monitor: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = _cluster(
        _record(NodeID=f"n{ESCAPES}", MetricsExportPort=-1),
        _record(NodeID=f"m{ESCAPES}", NodeManagerHostname=f"host{ESCAPES}", MetricsExportPort=-1),
    )
    cluster.add_node(address="10.0.0.2", port=-1, hostname=f"plain{ESCAPES}", node_id=NODE_A)
    monitor = make_monitor(cluster)

    with caplog.at_level(logging.DEBUG, logger="raylens"):
        monitor.collect_once()

    messages = [r.getMessage() for r in caplog.records]
    assert any("serves no metrics" in m for m in messages)
    assert all(not _has_control(m) for m in messages), messages
    assert [row.node_id for row in monitor.latest()] == [NODE_A]


# Host names -------------------------------------------------------------------------


def test_a_huge_host_name_is_cut_where_it_enters_and_says_how_long_it_was(
    caplog: pytest.LogCaptureFixture,
) -> None:
    huge = "h" * 2**20
    cluster = _cluster(_record(NodeManagerHostname=huge))

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        (node,) = hm.ray_nodes(cluster)
        hm.ray_nodes(cluster)

    assert node.host.startswith("h" * 200)
    assert len(node.host) <= 300
    assert str(2**20) in node.host
    assert node.metrics_url == "http://10.0.0.9:8080/metrics"  # the node is still scraped
    (warning,) = _warnings(caplog)
    assert str(2**20) in warning and len(warning) < 1000


def test_a_huge_host_name_makes_no_huge_log_line(
    make_monitor: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = _cluster(
        _record(NodeID=NODE_A, NodeManagerHostname="h" * 2**20, MetricsExportPort=-1),
        _record(NodeID=NODE_C, NodeManagerHostname="g" * 2**20, MetricsExportPort="9"),
    )
    monitor = make_monitor(cluster)

    with caplog.at_level(logging.DEBUG, logger="raylens"):
        monitor.collect_once()

    messages = [r.getMessage() for r in caplog.records]
    assert any("serves no metrics" in m for m in messages)
    assert any("malformed" in m for m in messages)
    assert max(len(m) for m in messages) < 2000


def test_a_host_name_of_normal_length_is_kept_whole() -> None:
    name = "gpu-" + "x" * 250
    (node,) = hm.ray_nodes(_cluster(_record(NodeManagerHostname=name)))
    assert node.host == name


# Addresses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "raylet@127.0.0.2",
        "user:pw@10.0.0.1",
        "10.0.0.1:8080",
        "10.0.0.1/metrics",
        "http://10.0.0.1",
        "10.0.0.1?x=1",
        "10.0.0.1#x",
        "[fd00::1]",
        "fe80::1%eth0",
        "10.0.0.01",
        "1.2.3",
        "999.0.0.1",
        "-leading.example",
        "trailing-.example",
        "two..dots",
        "a b",
        "host\x1b[2J",
        "x" * 64 + ".example",
        ("a" * 60 + ".") * 5,
        " 10.0.0.1",
    ],
)
def test_an_address_that_is_not_an_ip_or_host_name_is_refused_and_never_scraped(
    address: str, caplog: pytest.LogCaptureFixture
) -> None:
    warning = _refused_with_one_warning(_record(NodeManagerAddress=address), caplog)
    assert "NodeManagerAddress" in warning
    assert "IPv4" in warning and "host name" in warning
    assert not _has_control(warning)


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("10.0.0.1", "http://10.0.0.1:8080/metrics"),
        ("fd00::1", "http://[fd00::1]:8080/metrics"),
        ("::ffff:10.0.0.1", "http://[::ffff:10.0.0.1]:8080/metrics"),
        ("localhost", "http://localhost:8080/metrics"),
        ("gpu-7.cluster.local", "http://gpu-7.cluster.local:8080/metrics"),
        ("gpu-7.cluster.local.", "http://gpu-7.cluster.local.:8080/metrics"),
        ("worker_3", "http://worker_3:8080/metrics"),
    ],
)
def test_ip_literals_and_host_names_are_scraped(address: str, url: str) -> None:
    (node,) = hm.ray_nodes(_cluster(_record(NodeManagerAddress=address)))
    assert node.metrics_url == url
    assert node.ip == address


# Metrics ports ----------------------------------------------------------------------


@pytest.mark.parametrize("port", ["9", True, False, 70000, 0, 65536, -2, 9.0, [8080]])
def test_a_malformed_metrics_port_is_reported_as_malformed_not_as_missing(
    port: object, caplog: pytest.LogCaptureFixture
) -> None:
    warning = _refused_with_one_warning(_record(MetricsExportPort=port), caplog)
    assert f"MetricsExportPort is {port!r}" in warning
    assert "1..65535" in warning and "-1" in warning
    assert "ray[default]" not in warning


@pytest.mark.parametrize("port", [-1, None, "missing"])
def test_a_missing_metrics_port_still_means_no_metrics(port: object) -> None:
    record = _record() if port == "missing" else _record(MetricsExportPort=port)
    if port == "missing":
        del record["MetricsExportPort"]
    cluster = _cluster(record)

    assert hm.ray_nodes(cluster) == []
    (node,) = hm.ray_nodes(cluster, include_unscrapeable=True)
    assert node.metrics_url == "" and not node.serves_metrics


def test_a_malformed_port_costs_only_its_own_node(make_monitor: Callable[..., Any]) -> None:
    cluster = _cluster(_record(MetricsExportPort=True))
    plain = cluster.add_node(address="10.0.0.2", port=-1, node_id=NODE_A)
    monitor = make_monitor(cluster)

    monitor.collect_once()

    (row,) = monitor.latest()
    assert row.node_id == plain and row.error is not None and "ray[default]" in row.error


def test_each_malformed_node_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    cluster = _cluster(_record(MetricsExportPort="9"), _record(NodeID=NODE_A, MetricsExportPort=0))

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for _ in range(3):
            hm.ray_nodes(cluster)

    assert len(_warnings(caplog)) == 2


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The records ``ray_nodes`` checks from now on, in order."""
    from raylens.telemetry.host_memory import _nodes

    checked: list[object] = []
    original = _nodes._node_from_record

    def counting(entry: object, seen: set[str], unscrapeable: bool) -> object:
        checked.append(entry)
        return original(entry, seen, unscrapeable)

    monkeypatch.setattr(_nodes, "_node_from_record", counting)
    return checked


def test_a_record_seen_again_unchanged_is_not_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raylens.telemetry.host_memory import _nodes

    cluster = FakeCluster()
    first = cluster.add_node(address="127.0.0.1", port=9100, hostname="a")
    cluster.add_node(address="127.0.0.2", port=9100, hostname="b")
    assert len(_nodes.ray_nodes(cluster)) == 2
    checked = _count_checks(monkeypatch)
    again = _nodes.ray_nodes(cluster)
    assert [node.host for node in again] == ["a", "b"] and checked == []

    cluster.kill_node(first)
    cluster.add_node(address="127.0.0.3", port=9100, hostname="c")
    assert [node.host for node in _nodes.ray_nodes(cluster)] == ["b", "c"]
    live = [entry for entry in checked if isinstance(entry, dict) and entry.get("Alive")]
    assert len(live) == 1  # only the new record; a dead one is dropped at its first field


def test_a_record_seen_again_is_the_same_node_object() -> None:
    cluster = _cluster(_record())

    assert hm.ray_nodes(cluster)[0] is hm.ray_nodes(cluster)[0]


@pytest.mark.parametrize(
    "changed",
    [
        {"MetricsExportPort": 8080.0},  # equals the int the cached record held
        {"MetricsExportPort": True, "NodeID": NODE_A},  # True equals 1
        {"NodeManagerHostname": ["h"]},
    ],
)
def test_a_record_equal_to_a_checked_one_but_not_plain_is_checked_afresh(
    changed: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    plain = _record(**{"NodeID": NODE_A, "MetricsExportPort": 1} if "NodeID" in changed else {})
    assert len(hm.ray_nodes(_cluster(plain))) == 1

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        found = hm.ray_nodes(_cluster(_record(**changed)))

    if "NodeManagerHostname" in changed:  # a non-str host name is shown as the address
        assert [node.host for node in found] == ["10.0.0.9"]
    else:
        assert found == [] and any("MetricsExportPort" in w for w in _warnings(caplog))


def test_callers_with_and_without_unscrapeable_nodes_each_keep_their_checked_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raylens.telemetry.host_memory import _nodes

    cluster = _cluster(_record(), _record(NodeID=NODE_A, MetricsExportPort=-1))
    assert len(_nodes.ray_nodes(cluster)) == 1
    assert len(_nodes.ray_nodes(cluster, include_unscrapeable=True)) == 2
    checked = _count_checks(monkeypatch)
    assert len(_nodes.ray_nodes(cluster)) == 1
    assert len(_nodes.ray_nodes(cluster, include_unscrapeable=True)) == 2
    # Only the record that the first call leaves out (it yields no node to keep).
    assert [entry["MetricsExportPort"] for entry in checked] == [-1]  # type: ignore[index]


def test_a_record_of_a_dict_subclass_is_still_read() -> None:
    class Record(dict):  # type: ignore[type-arg]
        pass

    cluster = _cluster(Record(_record()))

    assert [node.node_id for node in hm.ray_nodes(cluster)] == [NODE_C]
    assert [node.node_id for node in hm.ray_nodes(cluster)] == [NODE_C]

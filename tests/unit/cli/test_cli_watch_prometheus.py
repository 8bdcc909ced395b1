"""``raylens watch --prometheus``: the watch table and ``--json`` from a fake Prometheus."""

from __future__ import annotations

import json
import threading

import pytest

from raylens.cli import main
from raylens.cli.parser import build_parser
from raylens.cli.prometheus_watch import run_prometheus_watch
from raylens_fakes.prometheus_api import FakePrometheus, FakeTarget

GIB = 1024**3


def _fake() -> FakePrometheus:
    import time

    now = time.time()
    fake = FakePrometheus(now=now)
    fake.targets["10.0.0.1:8080"] = FakeTarget(
        ip="10.0.0.1",
        used=4 * GIB,
        scraped_at=now - 1,
        sampled_at=now - 1,
        groups={"policy": (2 * GIB, None, 3.0, 512.0)},
        node=(4 * GIB, 512.0, 0.0, 1.0, 60 * GIB, 3600.0, 600.0),
    )
    fake.targets["10.0.0.2:8080"] = FakeTarget(ip="10.0.0.2", up=0.0, series=False)
    return fake


def test_watch_once_json_shows_nodes_groups_and_growth_from_prometheus(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = build_parser().parse_args(
        ["watch", "--prometheus", "http://127.0.0.1:9", "--once", "--json"]
    )
    fake = _fake()
    assert run_prometheus_watch(args, threading.Event(), fetch=fake.fetch) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (node,) = record["nodes"]
    assert node["node_id"] == "10.0.0.1:8080" and node["host"] == "10.0.0.1"
    assert node["used_bytes"] == 4 * GIB and node["worker_groups"] == "policy"
    assert node["worker_group_rss_bytes"] == {"policy": 2 * GIB}
    assert node["growth_bytes_per_second"] == 512.0
    assert node["worker_group_growth_bytes_per_second"] == {"policy": 512.0}
    assert node["time_to_limit_seconds"] == 3600.0 and node["limit_bytes"] == 60 * GIB


def test_the_url_comes_from_the_environment_when_the_flag_has_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYLENS_PROMETHEUS_URL", "http://127.0.0.1:9")
    args = build_parser().parse_args(["watch", "--prometheus", "--once", "--json"])
    assert run_prometheus_watch(args, threading.Event(), fetch=_fake().fetch) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["nodes"]


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ftp://x", "not a Prometheus URL"),
        ("http://user:secret@host:9090", "holds credentials"),
        ("http://host:9090/?q=1", "query or fragment"),
    ],
)
def test_a_bad_url_is_one_line_naming_it(
    url: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", "--prometheus", url, "--once"]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1
    assert "secret" not in err


def test_an_unreachable_prometheus_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from raylens.telemetry.prometheus_source import Answer

    def refused(_settings: object, queries: tuple) -> dict:
        return {query: Answer(None, "ClientConnectorError: refused", 0.0) for query in queries}

    args = build_parser().parse_args(["watch", "--prometheus", "http://127.0.0.1:9", "--once"])
    from raylens.cli.parser import CliError

    with pytest.raises(
        CliError, match=r"cannot read Prometheus at http://127\.0\.0\.1:9: .*refused"
    ):
        run_prometheus_watch(args, threading.Event(), fetch=refused)

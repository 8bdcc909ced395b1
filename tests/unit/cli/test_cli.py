"""The raylens command: flags, errors, and the profile and simulate commands end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raylens.cli import main


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "raylens", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().startswith("raylens ")


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["simulate", "--interval", "0"], "--interval"),
        (["simulate", "--interval", "soon"], "--interval"),
        (["simulate", "--nodes", "0"], "--nodes"),
        (["simulate", "--hung", "-1"], "--hung"),
        (["demo", "--nodes", "1"], "--nodes"),
        (["watch", "--exporter", "jaeger"], "--exporter"),
        (["profile", "--pss-interval", "-2", "--", "true"], "--pss-interval"),
        (["simulate", "--interval", "1e300"], "--interval"),
        (["profile", "--interval", "1e12", "--", "true"], "--interval"),
        (["watch", "--duration", "inf"], "--duration"),
    ],
)
def test_bad_flag_values_name_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err
    assert "Traceback" not in err


def test_more_hung_than_nodes_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", "2", "--hung", "3", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "raylens: error: --hung 3 is more than --nodes 2"


def test_bad_exporter_environment_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAYLENS_EXPORTER", "jaeger")
    assert main(["simulate", "--nodes", "1", "--once"]) == 2
    err = capsys.readouterr().err
    assert "RAYLENS_EXPORTER='jaeger'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["watch", "--once"], ["demo", "--duration", "1"]])
def test_ray_missing_says_how_to_install(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "raylens: error: Ray is not installed; install it with: pip install 'raylens[ray]'"
    )


def test_profile_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile"]) == 2
    assert "profile needs a command" in capsys.readouterr().err


@pytest.mark.slow
def test_profile_of_a_missing_program(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--", "/nonexistent/program"]) == 2
    err = capsys.readouterr().err
    assert "'/nonexistent/program'" in err and "Traceback" not in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees need Linux /proc")
@pytest.mark.slow
def test_profile_reports_memory_and_passes_the_exit_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = (
        "import sys, time; block = bytearray(40 * 1024 * 1024); "
        "block[::4096] = b'x' * len(block[::4096]); time.sleep(0.6); sys.exit(3)"
    )
    status = main(["profile", "--interval", "0.2", "--json", "--", sys.executable, "-c", script])
    assert status == 3
    records = _json_lines(capsys.readouterr().out)
    summary = records[-1]
    assert summary["summary"] is True and summary["exit_status"] == 3
    assert summary["servers"][0]["rss_peak_bytes"] >= 40 * 1024 * 1024
    assert all(len(r["servers"]) == 1 for r in records)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees need Linux /proc")
@pytest.mark.slow
def test_profile_once_prints_one_sample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--once", "--json", "--", sys.executable, "-c", "pass"]) == 0
    records = _json_lines(capsys.readouterr().out)
    assert len(records) == 1
    assert records[0]["servers"][0]["processes"] >= 0


@pytest.mark.slow
def test_simulate_once_json_shows_every_node_and_the_hung_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(
        ["simulate", "--nodes", "4", "--hung", "1", "--once", "--json", "--scrape-timeout", "0.5"]
    )
    assert status == 0
    records = _json_lines(capsys.readouterr().out)
    assert len(records) == 1
    nodes = records[0]["nodes"]
    assert len(nodes) == 4
    assert len({node["node_id"] for node in nodes}) == 4
    failed = [node for node in nodes if node["error"] is not None]
    healthy = [node for node in nodes if node["error"] is None]
    assert len(failed) == 1 and len(healthy) == 3
    assert failed[0]["used_bytes"] is None
    for node in healthy:
        assert node["total_bytes"] == 64 * 1024**3
        assert 0 < node["used_bytes"] < node["total_bytes"]
        assert node["age_seconds"] is not None
    assert sorted(node["worker_groups"] for node in nodes) == [
        "policy",
        "policy",
        "rollout",
        "rollout",
    ]


@pytest.mark.slow
def test_simulate_writes_one_line_per_sample_outside_a_terminal_until_duration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["simulate", "--nodes", "2", "--interval", "0.2", "--duration", "0.5"])
    assert status == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2
    for line in lines:
        assert line.startswith("Simulated cluster: 2 nodes, 0 hung"), line
        assert ": 2 nodes on 2 hosts, 0 failing, " in line and " used (" in line


@pytest.mark.slow
def test_simulate_once_outside_a_terminal_still_writes_its_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--nodes", "2", "--once"]) == 0
    out = capsys.readouterr().out
    assert "sim-node-0" in out and "sim-node-1" in out
    assert "policy" in out and "rollout" in out


def test_simulate_feeds_the_chosen_exporter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", "2", "--once", "--exporter", "console"]) == 0
    out = capsys.readouterr().out
    assert 'rl.host.memory.used{host.name="sim-node-0"' in out
    assert 'rl.worker_groups="policy"' in out


def test_profile_rows_from_a_fake_process_tree(tmp_path) -> None:
    from fake_profiles import profiler_over

    from raylens.cli.profile import ProcessTable
    from raylens_fakes.procfs import FakeProcFS

    page = 4096
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=1000 * page, pss_bytes=800 * page)
    fake.add_process(101, parent=100, rss_bytes=500 * page, pss_bytes=300 * page)
    profiler = profiler_over(fake, 60.0)
    table = ProcessTable(profiler, label="python train.py", pid=100)
    profiler.sample_once()
    (row,) = table.rows()
    assert (row.processes, row.rss, row.pss) == (2, 1500 * page, 1100 * page)
    assert row.rss_peak == 1500 * page and 0 <= row.pss_age_s < 60
    fake.remove_process(101)
    profiler.sample_once()
    (row,) = table.rows()
    assert (row.processes, row.rss) == (1, 1000 * page)
    assert row.rss_peak == 1500 * page
    assert row.history == [1500 * page, 1000 * page]


@pytest.mark.parametrize(("flags", "shown"), [([], False), (["--verbose"], True)])
@pytest.mark.slow
def test_scrape_warnings_only_with_verbose(flags: list[str], shown: bool) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "raylens", *flags, "simulate", "--nodes", "2"),
            *("--hung", "1", "--once", "--json", "--scrape-timeout", "0.3"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert ("no host-memory sample from node" in result.stderr) is shown, result.stderr


def test_unreachable_address_fails_fast_naming_it() -> None:
    import socket

    from raylens.cli.gcs_probe import CliError, check_reachable

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        with pytest.raises(CliError, match=rf"cannot reach a Ray cluster at '127.0.0.1:{port}'"):
            check_reachable(f"127.0.0.1:{port}")


@pytest.mark.slow
def test_auto_passes_the_reachability_check_and_silence_does_not() -> None:
    import socket

    from raylens.cli.gcs_probe import CliError, check_reachable

    check_reachable("auto")
    check_reachable("ray://head:10001")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(CliError, match=rf"at '{address}': no answer within 0.3 s"):
            check_reachable(address, timeout=0.3)
    with pytest.raises(CliError, match=r"--address='head' is not HOST:PORT"):
        check_reachable("head")


def test_scrape_deadline_never_outlasts_the_refresh() -> None:
    from raylens.cli.pipeline import scrape_timeout_for
    from raylens.telemetry.host_memory import SCRAPE_TIMEOUT_S

    assert scrape_timeout_for(0.5) == 0.5
    assert scrape_timeout_for(60.0) == SCRAPE_TIMEOUT_S


# ------------------------------------------------------------- hostile flags and start-up


@pytest.mark.parametrize(
    ("argv", "flag", "minimum"),
    [
        (["simulate", "--interval", "1e-300"], "--interval", "0.05"),
        (["simulate", "--interval", "0.001"], "--interval", "0.05"),
        (["profile", "--interval", "1e-9", "--", "true"], "--interval", "0.05"),
        (["profile", "--pss-interval", "1e-300", "--", "true"], "--pss-interval", "0.05"),
        (["simulate", "--scrape-timeout", "1e-300"], "--scrape-timeout", "0.001"),
        (["watch", "--duration", "1e-300"], "--duration", "0.001"),
    ],
)
def test_tiny_seconds_are_refused_naming_the_flag_and_the_minimum(
    argv: list[str], flag: str, minimum: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and f"at least {minimum} s" in err, err


@pytest.mark.parametrize("nodes", ["100000", "30000"])
def test_more_simulated_nodes_than_allowed_are_refused_up_front(
    nodes: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from raylens.cli.cluster_views import MAX_SIMULATED_NODES

    assert main(["simulate", "--nodes", nodes, "--once"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"raylens: error: --nodes {nodes} ")
    assert f"at most {MAX_SIMULATED_NODES}" in line


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_NOFILE")
@pytest.mark.slow
def test_simulated_nodes_beyond_the_open_file_limit_are_refused_up_front() -> None:
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    result = subprocess.run(
        [sys.executable, "-m", "raylens", "simulate", "--nodes", "100", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=low_limit,
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "--nodes 100" in line and "open files" in line and "200" in line


@pytest.mark.parametrize("flags", [["--json"], []], ids=["json", "table"])
@pytest.mark.slow
def test_a_closed_stdout_ends_quietly(flags: list[str]) -> None:
    result = subprocess.run(
        [
            "sh",
            "-c",
            'exec "$@" >&-',
            "sh",
            *(sys.executable, "-m", "raylens", "simulate", "--nodes", "1", "--once", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""


def test_ctrl_c_while_the_command_loads_is_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.abc

    class Interrupting(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: object, target: object = None) -> None:
            if name == "raylens.cli.app":
                raise KeyboardInterrupt
            return None

    for name in [m for m in sys.modules if m.startswith("raylens.cli.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert main(["simulate", "--once"]) == 130
    assert capsys.readouterr().err == "raylens: interrupted\n"


def test_ctrl_c_while_flags_are_parsed_is_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from raylens.cli import app

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(app, "build_parser", interrupted)
    assert main(["simulate", "--once"]) == 130
    assert capsys.readouterr().err == "raylens: interrupted\n"


@pytest.mark.slow
def test_the_entry_point_loads_nothing_heavy() -> None:
    """What runs before main() can catch Ctrl-C is only the interpreter and this import."""
    script = (
        "import sys, raylens.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('rich', 'opentelemetry', 'requests', 'psutil', 'numpy') "
        "or (m.startswith('raylens.cli.') and m != 'raylens.cli.entry')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_sigterm_ends_simulate_with_143_quietly() -> None:
    import signal

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raylens",
            "simulate",
            "--nodes",
            "2",
            "--interval",
            "0.2",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().startswith("{")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 143, err
    assert "Traceback" not in err and "terminated" in err, err


# ------------------------------------------------------------- what a first look shows


@pytest.mark.slow
def test_simulate_json_carries_the_summary_and_the_table_shows_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--nodes", "3", "--hung", "1", "--once", "--scrape-timeout", "0.5"]
    assert main([*argv, "--json"]) == 0
    (record,) = _json_lines(capsys.readouterr().out)
    totals = record["totals"]
    assert (totals["nodes"], totals["failing"]) == (3, 1)
    assert totals["total_bytes"] == 2 * 64 * 1024**3
    assert main(argv) == 0
    assert "3 nodes on 3 hosts, 1 failing, " in capsys.readouterr().out


def test_simulate_lists_nodes_in_natural_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", "12", "--once", "--scrape-timeout", "2"]) == 0
    out = capsys.readouterr().out
    positions = [out.index(f"sim-node-{i} ") for i in range(12)]
    assert positions == sorted(positions), out


@pytest.mark.slow
def test_the_prometheus_address_is_printed_when_that_exporter_is_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    monkeypatch.setenv("RAYLENS_PROMETHEUS_ADDR", "127.0.0.1:0")
    assert main(["simulate", "--nodes", "1", "--once", "--json", "--exporter", "prometheus"]) == 0
    out, err = capsys.readouterr()
    assert len(_json_lines(out)) == 1  # stdout keeps JSON lines only
    found = re.search(r"Prometheus metrics at http://127\.0\.0\.1:(\d+)/metrics", err)
    assert found and int(found.group(1)) > 0, err


def test_no_prometheus_address_without_that_exporter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", "1", "--once", "--exporter", "none"]) == 0
    assert "Prometheus" not in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_that_python_swallows_still_ends_the_command_with_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python drops a KeyboardInterrupt raised inside a finalizer (as in an import lock's
    clean-up): the command must end all the same."""
    import signal
    import threading

    from raylens.cli import app

    class InterruptedWhileCollected:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)

    def command(args: object, stop: threading.Event) -> int:
        InterruptedWhileCollected()  # collected at once; its interrupt is lost
        assert stop.wait(30), "the interrupt did not stop the command"
        return 0

    monkeypatch.setitem(app._HANDLERS, "simulate", command)
    assert main(["simulate", "--once"]) == 130
    err = capsys.readouterr().err
    assert "raylens: interrupted" in err


def test_simulate_scrapes_with_the_deadline_sized_for_its_node_count(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every simulated raylet shares this process with the scraper: a deadline cut to a
    one-second refresh would report the machine's load as failed nodes.

    How the default grows with the node count is checked as a computation below; here
    the command is shown to use it, on a cluster small enough (20 nodes, 50 ms of
    deadline each, ten times what the default allows a node) that none fails however
    busy the machine is.
    """
    from raylens.cli.cluster_views import simulated_scrape_timeout
    from raylens.telemetry import host_memory

    deadlines: list[float | None] = []

    class RecordingMonitor(host_memory.HostMemoryMonitor):
        def __init__(self, *args: object, scrape_timeout: float | None = None, **kwargs: object):
            deadlines.append(scrape_timeout)
            super().__init__(*args, scrape_timeout=scrape_timeout, **kwargs)

    monkeypatch.setattr(host_memory, "HostMemoryMonitor", RecordingMonitor)
    assert main(["simulate", "--nodes", "20", "--once", "--json"]) == 0
    assert deadlines == [simulated_scrape_timeout(20, 1.0)]
    (record,) = _json_lines(capsys.readouterr().out)
    assert record["totals"]["nodes"] == 20
    assert record["totals"]["failing"] == 0, [n["error"] for n in record["nodes"] if n["error"]][:3]


def test_the_simulated_scrape_deadline_grows_with_the_node_count() -> None:
    from raylens.cli.cluster_views import simulated_scrape_timeout
    from raylens.telemetry.host_memory import SCRAPE_TIMEOUT_S

    assert simulated_scrape_timeout(8, 1.0) == 1.0
    assert simulated_scrape_timeout(400, 1.0) == pytest.approx(2.0)
    assert simulated_scrape_timeout(2000, 1.0) == SCRAPE_TIMEOUT_S
    assert simulated_scrape_timeout(8, 0.2) == 0.2

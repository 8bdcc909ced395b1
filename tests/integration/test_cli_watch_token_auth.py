"""`raylens watch` against a real Ray head with token authentication on.

The head is started with ``ray start --head --block`` in a session of its own, so the
test stops exactly the processes it started (SIGTERM to ``ray start``, which takes its
GCS, raylet and agents down with it) and never the other Ray processes of the machine,
as ``ray stop`` would. It then checks that none of them is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

START_DEADLINE_S = 90.0
STOP_DEADLINE_S = 30.0
# The promise: a refusal comes within a few seconds, Python and Ray's import included.
REFUSAL_DEADLINE_S = 15.0
# What ray start --block prints once the head is up.
_READY = "block forever"
_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")


@dataclass
class TokenHead:
    address: str
    token: str
    home: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _session_pids(session: int) -> set[int]:
    """Live (not zombie) processes whose session id is ``session``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:
            found.add(int(entry))
    return found


def _started_by(pid: int) -> set[int]:
    """``pid``'s descendants and the members of its session, which ``ray start`` opened."""
    import psutil

    try:
        children = {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        children = set()
    return children | _session_pids(pid)


def _still_alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return alive


def _client_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without Ray's auth settings, ``home`` as HOME, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _AUTH_VARIABLES}
    env["HOME"] = str(home)  # no ~/.ray/auth_token from the machine's user
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def token_head() -> Iterator[TokenHead]:
    pytest.importorskip("ray")
    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if ray_cli is None:
        pytest.skip("the ray command is not installed")
    token = secrets.token_hex(32)
    scratch = Path(tempfile.mkdtemp(prefix="rl-tok-"))  # short: Ray's socket paths must fit
    home = scratch / "home"
    home.mkdir()
    port = _free_port()
    command = [
        ray_cli,
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--num-cpus=1",
        "--include-dashboard=false",
        f"--ray-client-server-port={_free_port()}",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--temp-dir={scratch / 'ray'}",
    ]
    env = _client_env(home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    log = scratch / "ray-start.log"
    with log.open("wb") as output:
        head = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # The GCS listens before the head's raylet is up; ray start says when all of it is.
        deadline = time.monotonic() + START_DEADLINE_S
        while not (_listening(port) and _READY in log.read_text(errors="replace")):
            if head.poll() is not None:
                pytest.fail(f"ray start --head exited with {head.returncode}: {log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the Ray head was not up within {START_DEADLINE_S} s")
            time.sleep(0.2)
        yield TokenHead(f"127.0.0.1:{port}", token, home)
    finally:
        started = _started_by(head.pid)
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(10)
        deadline = time.monotonic() + STOP_DEADLINE_S
        while _still_alive(started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _still_alive(started)
        for pid in left:  # only the processes this test started, by id
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(scratch, ignore_errors=True)
        assert not left, f"processes of the Ray head outlived it: {sorted(left)}"


def _watch(
    head: TokenHead, env: dict[str, str], *args: str
) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "raylens", "watch", "--address", head.address, "--once", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return time.monotonic() - started, result


def test_watch_without_a_token_says_how_to_give_one_in_one_line(token_head: TokenHead) -> None:
    took, result = _watch(token_head, _client_env(token_head.home))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        f"raylens: error: the Ray cluster at '{token_head.address}' asks for an authentication token"
    ), line
    assert "RAY_AUTH_MODE=token" in line and "RAY_AUTH_TOKEN" in line
    assert took < REFUSAL_DEADLINE_S, f"took {took:.1f} s"


def test_watch_with_the_wrong_token_says_it_was_refused(token_head: TokenHead) -> None:
    env = _client_env(token_head.home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)
    took, result = _watch(token_head, env)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "refused the authentication token" in line and "0" * 64 not in line, line
    assert took < REFUSAL_DEADLINE_S, f"took {took:.1f} s"


def test_watch_with_the_token_shows_the_cluster(token_head: TokenHead) -> None:
    env = _client_env(token_head.home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token_head.token)
    _took, result = _watch(token_head, env, "--json", "--interval", "5")
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert record["totals"]["nodes"] == 1, record

"""FakeRaylet: a real HTTP endpoint serving a Ray 2.60 payload, and misbehaving on request."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from raylens_fakes import FakeRaylet
from raylens_fakes.raylet import format_sample_value, load_payload


def _samples(text: str) -> dict[str, float]:
    """Every unlabelled-by-name sample value, parsed the slow, thorough way."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name] = sample.value
    return found


@pytest.fixture
def raylet() -> FakeRaylet:
    with FakeRaylet(used=3_000_000_000, total=32_000_000_000) as fake:
        yield fake


def test_serves_the_real_capture_with_the_memory_it_was_given(raylet: FakeRaylet) -> None:
    response = requests.get(raylet.url, timeout=5)

    assert response.status_code == 200
    assert raylet.url == f"http://127.0.0.1:{raylet.port}/metrics"
    samples = _samples(response.text)
    assert samples["ray_node_mem_used"] == 3e9
    assert samples["ray_node_mem_total"] == 32e9
    # Everything else is the capture's, look-alike series included, but for the
    # machine's pair, raised to the node's figures where the capture's are smaller.
    capture = _samples(load_payload("worker").decode())
    node = {"ray_node_mem_used": 3e9, "ray_node_mem_total": 32e9}
    machine = {"ray_node_mem_used_host": 3e9, "ray_node_mem_total_host": 32e9}
    assert samples == {**capture, **node, **machine}
    assert "ray_node_mem_used{" in response.text
    assert "ray_node_mem_used 3" not in response.text  # values keep Ray's scientific notation
    assert "} 3e+09\n" in response.text


def test_set_memory_and_memory_source_take_effect_on_the_next_request(raylet: FakeRaylet) -> None:
    raylet.set_memory(5e9, 6e9)
    assert _samples(requests.get(raylet.url, timeout=5).text)["ray_node_mem_used"] == 5e9

    readings = iter([(1.0, 2.0), (3.0, 4.0)])
    with FakeRaylet(memory=lambda: next(readings)) as scripted:
        first = _samples(requests.get(scripted.url, timeout=5).text)
        second = _samples(requests.get(scripted.url, timeout=5).text)
    assert (first["ray_node_mem_used"], first["ray_node_mem_total"]) == (1.0, 2.0)
    assert (second["ray_node_mem_used"], second["ray_node_mem_total"]) == (3.0, 4.0)


def test_head_template() -> None:
    with FakeRaylet(used=7.0, total=8.0, template="head") as head:
        body = requests.get(head.url, timeout=5).content
    assert len(body) > 300_000
    assert _samples(body.decode())["ray_node_mem_used"] == 7.0


def test_unknown_template_and_payload_without_memory_are_refused() -> None:
    with pytest.raises(ValueError, match=r"'tail'.*'worker' or 'head'"):
        load_payload("tail")
    with pytest.raises(ValueError, match="ray_node_mem_used"):
        FakeRaylet(template=b"# nothing here\n")


@pytest.mark.parametrize(
    ("value", "text"),
    [(1194815488.0, "1.194815488e+09"), (2.5276063744e10, "2.5276063744e+10"), (0.5, "0.5")],
)
def test_values_are_rendered_like_rays_exporter(value: float, text: str) -> None:
    assert format_sample_value(value) == text
    assert float(format_sample_value(value)) == value


def test_counts_requests_and_waits_for_them(raylet: FakeRaylet) -> None:
    assert raylet.requests == 0
    for _ in range(3):
        requests.get(raylet.url, timeout=5)
    assert raylet.requests == 3
    assert raylet.wait_for_requests(3, timeout=0.01)
    assert not raylet.wait_for_requests(4, timeout=0.01)


def test_calls_log_method_path_and_headers(raylet: FakeRaylet) -> None:
    requests.get(raylet.url, timeout=5, headers={"Accept-Encoding": "identity"})
    requests.get(raylet.url.replace("/metrics", "/other"), timeout=5)

    first, second = raylet.calls
    assert (first.method, first.path, second.path) == ("GET", "/metrics", "/other")
    assert first.headers["Accept-Encoding"] == "identity"
    assert raylet.calls is not raylet.calls  # a copy each time


def test_status_with_a_custom_reason_and_headers(raylet: FakeRaylet) -> None:
    raylet.respond_status(
        500, b"x", reason="\x1b]0;PWNED\x07", headers={"Content-Encoding": "gzip"}
    )
    with socket.create_connection((raylet.host, raylet.port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)

    status_line, *headers = head.split(b"\r\n")
    assert status_line == b"HTTP/1.0 500 \x1b]0;PWNED\x07"
    assert b"Content-Encoding: gzip" in headers


@pytest.mark.slow
def test_delay_answers_late() -> None:
    with FakeRaylet() as slow:
        slow.delay(0.3)
        started = time.monotonic()
        with pytest.raises(requests.ReadTimeout):
            requests.get(slow.url, timeout=0.05)
        assert requests.get(slow.url, timeout=5).status_code == 200
        assert time.monotonic() - started >= 0.3


def test_hang_never_answers_and_close_releases_it() -> None:
    hung = FakeRaylet()
    hung.hang()
    outcome: list[BaseException] = []

    client_timeout = 60.0

    def fetch() -> None:
        try:
            requests.get(hung.url, timeout=client_timeout)
        except requests.RequestException as exc:
            outcome.append(exc)

    client = threading.Thread(target=fetch, daemon=True)
    client.start()
    assert hung.wait_for_requests(1)
    assert hung.in_flight == 1

    started = time.monotonic()
    hung.close()
    client.join(timeout=client_timeout)

    # Ended by close(), not by the client's own timeout, however slow the machine.
    assert time.monotonic() - started < client_timeout / 2
    assert not client.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], requests.ConnectionError)
    assert hung.wait_idle(timeout=30)


@pytest.mark.slow
def test_hung_request_ends_when_the_client_leaves(raylet: FakeRaylet) -> None:
    raylet.hang()
    with pytest.raises(requests.ReadTimeout):
        requests.get(raylet.url, timeout=0.1)

    assert raylet.wait_idle(timeout=30)  # the handler thread did not stay behind


def test_trickle_sends_one_byte_at_a_time(raylet: FakeRaylet) -> None:
    raylet.trickle(0.02)
    with requests.get(raylet.url, stream=True, timeout=5) as response:
        assert response.headers["Content-Length"] == str(len(raylet.payload()))
        first = response.raw.read1(1024)
    assert len(first) == 1


def test_status_answers_with_any_code(raylet: FakeRaylet) -> None:
    raylet.respond_status(503, b"overloaded")
    response = requests.get(raylet.url, timeout=5)
    assert (response.status_code, response.content) == (503, b"overloaded")

    raylet.serve_normally()
    assert requests.get(raylet.url, timeout=5).status_code == 200


def test_reset_resets_the_connection(raylet: FakeRaylet) -> None:
    raylet.reset_connections()
    with pytest.raises(requests.ConnectionError) as caught:
        requests.get(raylet.url, timeout=5)
    assert "reset" in str(caught.value).lower()


def test_garbage_is_not_prometheus(raylet: FakeRaylet) -> None:
    raylet.serve_garbage()
    response = requests.get(raylet.url, timeout=5)

    assert response.status_code == 200
    with pytest.raises(ValueError):
        _samples(response.content.decode("utf-8", "replace"))


def test_huge_body_is_streamed_without_or_with_length(raylet: FakeRaylet) -> None:
    raylet.serve_huge(3_000_000)
    with requests.get(raylet.url, stream=True, timeout=5) as response:
        assert "Content-Length" not in response.headers
        assert sum(len(chunk) for chunk in response.iter_content(65536)) == 3_000_000

    raylet.serve_huge(1_000_000, announce_length=True)
    assert requests.get(raylet.url, timeout=5).headers["Content-Length"] == "1000000"


def test_omit_memory_series_keeps_the_look_alikes(raylet: FakeRaylet) -> None:
    raylet.omit_memory_series()
    samples = _samples(requests.get(raylet.url, timeout=5).text)

    assert "ray_node_mem_used" not in samples
    assert "ray_node_mem_total" not in samples
    assert "ray_node_mem_used_host" in samples
    assert "ray_node_mem_total_host" in samples
    assert "ray_node_mem_shared_bytes" in samples


def test_close_is_idempotent_and_stops_listening() -> None:
    raylet = FakeRaylet()
    port = raylet.port
    raylet.close()
    raylet.close()

    assert raylet.closed
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_many_raylets_share_one_accept_thread() -> None:
    before = threading.active_count()
    raylets = [FakeRaylet() for _ in range(50)]
    try:
        assert threading.active_count() <= before + 1
        assert all(requests.get(r.url, timeout=5).ok for r in raylets[::10])
    finally:
        for raylet in raylets:
            raylet.close()

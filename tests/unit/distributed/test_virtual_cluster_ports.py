"""Port bands per service and the helpers that find free ports inside a band.

The helpers bind sockets; here a stand-in socket decides which ports are taken, so the
outcome does not depend on what else runs on this machine.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

from raylens.distributed import _ports
from raylens.distributed import virtual_cluster as vc

# Lowest ephemeral-port floor seen on GPU nodes.
EPHEMERAL_FLOOR = 9000


class Sockets:
    """Stands for ``socket.socket``: binding a port in ``taken`` fails; records binds."""

    def __init__(self, taken: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.taken = set(taken)
        self.bound: list[int] = []
        self.closed = 0
        self.open = 0

    def __call__(self, *args: object) -> Sockets.Socket:
        self.open += 1
        return Sockets.Socket(self)

    class Socket:
        def __init__(self, owner: Sockets) -> None:
            self.owner = owner

        def bind(self, address: tuple[str, int]) -> None:
            port = address[1]
            if port in self.owner.taken:
                raise OSError(98, "Address already in use")
            self.owner.bound.append(port)

        def listen(self, backlog: int) -> None:
            pass

        def close(self) -> None:
            self.owner.closed += 1

        def __enter__(self) -> Sockets.Socket:
            return self

        def __exit__(self, *args: object) -> None:
            self.close()


@pytest.fixture
def sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sockets]:
    fake = Sockets()
    monkeypatch.setattr(_ports.socket, "socket", fake)
    yield fake


def test_bands_are_ordered_apart_and_below_the_ephemeral_floor() -> None:
    bands = [
        (vc.DEFAULT_DYNAMO_CONTROL_PORT_RANGE_LOW, vc.DEFAULT_DYNAMO_CONTROL_PORT_RANGE_HIGH),
        (vc.DEFAULT_MASTER_PORT_RANGE_LOW, vc.DEFAULT_MASTER_PORT_RANGE_HIGH),
        (vc.DEFAULT_GENERATION_PORT_RANGE_LOW, vc.DEFAULT_GENERATION_PORT_RANGE_HIGH),
        (vc.DEFAULT_GYM_PORT_RANGE_LOW, vc.DEFAULT_GYM_PORT_RANGE_HIGH),
        (vc.DEFAULT_VLLM_PORT_RANGE_LOW, vc.DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW),
        (vc.DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW, vc.DEFAULT_SGLANG_ROUTER_PORT_RANGE_HIGH),
        (
            vc.DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_LOW,
            vc.DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_HIGH,
        ),
    ]
    for (low, high), (next_low, _) in itertools.pairwise(bands):
        assert 1024 < low < high <= next_low < EPHEMERAL_FLOOR
    # Dynamo's HTTP and system endpoints sit inside the generation band.
    assert (
        vc.DEFAULT_GENERATION_PORT_RANGE_LOW
        <= vc.DEFAULT_DYNAMO_HTTP_PORT_RANGE_LOW
        < vc.DEFAULT_DYNAMO_HTTP_PORT_RANGE_HIGH
        <= vc.DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_LOW
        < vc.DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_HIGH
        <= vc.DEFAULT_GENERATION_PORT_RANGE_HIGH
    )
    # Eight vLLM engines stay under the SGLang carve-out and above Ray's dashboard port.
    top_engine = vc.DEFAULT_VLLM_PORT_RANGE_LOW + 8 * vc.DEFAULT_VLLM_PORTS_PER_ENGINE
    assert top_engine < vc.DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW
    assert vc.DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW > 8265


def test_bind_in_range_retries_taken_ports(
    sockets: Sockets, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks = iter([20003, 20001, 20009, 20005])
    monkeypatch.setattr(random, "randint", lambda low, high: next(picks))
    sockets.taken = set(range(20000, 20009))
    port = vc._bind_socket_in_range(sockets(), 20000, 20010, max_retries=50)
    assert port == 20009
    assert sockets.bound == [20009]


def test_bind_in_range_gives_up_after_its_retries(
    sockets: Sockets, monkeypatch: pytest.MonkeyPatch
) -> None:
    sockets.taken = {20000}
    tries: list[int] = []
    monkeypatch.setattr(random, "randint", lambda low, high: tries.append(low) or low)
    with pytest.raises(RuntimeError, match=r"\[20000, 20001\) after 7 attempts"):
        vc._bind_socket_in_range(sockets(), 20000, 20001, max_retries=7)
    assert len(tries) == 7


def test_bind_in_range_skips_excluded_ports_without_binding_them(sockets: Sockets) -> None:
    port = vc._bind_socket_in_range(
        sockets(), 20000, 20004, max_retries=None, excluded_ports={20000, 20001, 20003}
    )
    assert port == 20002
    assert sockets.bound == [20002]


def test_exhaustive_search_names_how_many_ports_it_tried(sockets: Sockets) -> None:
    sockets.taken = {20000, 20001}
    with pytest.raises(vc.PortRangeError, match=r"all 2 ports not excluded"):
        vc._bind_socket_in_range(sockets(), 20000, 20003, max_retries=None, excluded_ports={20002})


@pytest.mark.parametrize(
    ("low", "high", "match"),
    [(0, 10, r"port_range_low=0"), (10, 70000, r"port_range_high=70000"), ("1", 9, r"'1'")],
)
def test_bad_ranges_are_named(low: object, high: object, match: str, sockets: Sockets) -> None:
    with pytest.raises(ValueError, match=match):
        vc._bind_socket_in_range(sockets(), low, high)  # type: ignore[arg-type]


def test_free_port_is_in_the_master_band_by_default_and_released(sockets: Sockets) -> None:
    port = vc._get_free_port_local()
    assert vc.DEFAULT_MASTER_PORT_RANGE_LOW <= port < vc.DEFAULT_MASTER_PORT_RANGE_HIGH
    assert sockets.closed == sockets.open == 1


def test_consecutive_ports_skip_a_block_with_a_taken_port(sockets: Sockets) -> None:
    sockets.taken = {20002}
    assert vc._get_free_consecutive_ports_local(20000, 20010, consecutive=3) == 20003
    assert sockets.closed == sockets.open  # every probe released


def test_consecutive_ports_follow_a_cursor_and_fit_against_the_top(sockets: Sockets) -> None:
    first = vc._get_free_consecutive_ports_local(20000, 20010, consecutive=4)
    second = vc._get_free_consecutive_ports_local(20000, 20010, consecutive=4, start_port=first + 4)
    assert (first, second) == (20000, 20004)
    assert vc._get_free_consecutive_ports_local(20000, 20004, consecutive=4) == 20000
    assert vc._get_free_consecutive_ports_local(20005, 20010, consecutive=1, start_port=5) == 20005


def test_consecutive_ports_fail_when_no_block_fits(sockets: Sockets) -> None:
    with pytest.raises(vc.PortRangeError, match=r"5 consecutive free ports in \[20000, 20003\)"):
        vc._get_free_consecutive_ports_local(20000, 20003, consecutive=5)
    with pytest.raises(RuntimeError, match=r"consecutive free ports"):
        vc._get_free_consecutive_ports_local(20000, 20003, consecutive=1, start_port=20003)


@pytest.mark.parametrize("size", [0, -2])
def test_block_size_below_one_is_refused_as_nemo_rl_does(size: int) -> None:
    with pytest.raises(AssertionError, match=r"consecutive must be >= 1"):
        vc._get_free_consecutive_ports_local(20000, 20010, consecutive=size)
    with pytest.raises(ValueError):
        vc._get_free_consecutive_ports_local(20000, 20010, consecutive=size)

"""The demo cluster's start and teardown under Ctrl-C, with stand-ins for Ray (no Ray imported)."""

from __future__ import annotations

import os
import signal
import sys
import types

import pytest

from raylens.demo import DemoCluster, _interrupts_deferred


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


class _FakeRayCluster:
    """Stands in for ray.cluster_utils.Cluster; Ctrl-C arrives while the head node starts."""

    def __init__(self, events: list[str], initialize_head: bool = False, **kwargs: object) -> None:
        self.events = events
        self.address = "127.0.0.1:1"
        if initialize_head:
            self.add_node()

    def add_node(self, **kwargs: object) -> None:
        self.events.append("node starting")
        _ctrl_c()
        self.events.append("node recorded")

    def shutdown(self) -> None:
        self.events.append("cluster shut down")


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    events: list[str] = []
    ray = types.ModuleType("ray")
    ray.shutdown = lambda: events.append("driver disconnected")  # type: ignore[attr-defined]
    ray.init = lambda **kwargs: events.append("driver connected")  # type: ignore[attr-defined]
    cluster_utils = types.ModuleType("ray.cluster_utils")
    cluster_utils.Cluster = lambda *a, **kw: _FakeRayCluster(events, *a, **kw)  # type: ignore[attr-defined]
    ray.cluster_utils = cluster_utils  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.cluster_utils", cluster_utils)
    return events


def test_ctrl_c_while_a_node_starts_still_shuts_that_node_down(fake_ray: list[str]) -> None:
    with pytest.raises(KeyboardInterrupt), DemoCluster(2):
        pass
    assert fake_ray[:2] == ["node starting", "node recorded"]
    assert fake_ray[-1] == "cluster shut down"


class _Group:
    name_prefix = "policy"

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def shutdown(self, timeout: float) -> None:
        self.events.append("group shutting down")
        _ctrl_c()
        self.events.append("group shut down")


class _Reservation:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def shutdown(self) -> None:
        raise RuntimeError("placement group already gone")


def test_ctrl_c_during_teardown_is_held_until_every_ray_process_is_down(
    fake_ray: list[str],
) -> None:
    demo = DemoCluster(2)
    demo.groups = {"policy": _Group(fake_ray)}
    demo.virtual_cluster = _Reservation(fake_ray)
    demo.ray_cluster = _FakeRayCluster(fake_ray)
    with pytest.raises(KeyboardInterrupt):
        demo.close()
    assert fake_ray == [
        "group shutting down",
        "group shut down",
        "driver disconnected",
        "cluster shut down",
    ]
    assert demo.ray_cluster is None and demo.virtual_cluster is None
    demo.close()  # idempotent, and no interrupt is held any more
    assert fake_ray.count("cluster shut down") == 1


@pytest.mark.usefixtures("usual_ctrl_c")
def test_the_usual_ctrl_c_handler_is_back_after_a_deferred_block() -> None:
    before = signal.getsignal(signal.SIGINT)
    with _interrupts_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):
        _ctrl_c()


class _Terminated(Exception):
    pass


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


def test_sigterm_while_a_node_starts_is_held_until_the_node_is_recorded(
    fake_ray: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_FakeRayCluster, "add_node", _add_node_then_sigterm)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with pytest.raises(_Terminated), DemoCluster(2):
            pass
        assert signal.getsignal(signal.SIGTERM) is _raise_terminated
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert fake_ray[:2] == ["node starting", "node recorded"]
    assert fake_ray[-1] == "cluster shut down"


def _add_node_then_sigterm(self: _FakeRayCluster, **kwargs: object) -> None:
    self.events.append("node starting")
    os.kill(os.getpid(), signal.SIGTERM)
    self.events.append("node recorded")


def test_the_sigterm_handler_ray_init_installs_is_undone(
    fake_ray: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    from raylens import demo

    def init_like_ray(**kwargs: object) -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        raise RuntimeError("stop the start-up here")

    monkeypatch.setattr(_FakeRayCluster, "add_node", lambda self, **kwargs: None)
    monkeypatch.setattr(_FakeRayCluster, "wait_for_nodes", lambda self: None, raising=False)
    monkeypatch.setattr(ray, "init", init_like_ray)
    monkeypatch.setattr(demo.DemoCluster, "close", lambda self: None)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with pytest.raises(RuntimeError, match="stop the start-up"), DemoCluster(2):
            pass
        assert signal.getsignal(signal.SIGTERM) is _raise_terminated
    finally:
        signal.signal(signal.SIGTERM, previous)

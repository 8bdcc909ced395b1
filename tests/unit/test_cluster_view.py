"""ClusterView: the Ray-backed default reads Ray lazily; FakeCluster answers in Ray's shapes."""

from __future__ import annotations

import sys
import types

import pytest

from raylens.cluster import ClusterView, RayClusterView, default_cluster_view, ray_call_errors
from raylens_fakes import FakeCluster
from raylens_fakes.ray import FakeRay


def test_default_view_is_ray_backed_and_shared() -> None:
    assert isinstance(default_cluster_view(), RayClusterView)
    assert default_cluster_view() is default_cluster_view()


def test_is_initialized_is_false_without_importing_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ray", raising=False)

    assert RayClusterView().is_initialized() is False
    assert "ray" not in sys.modules


def _stub_ray(monkeypatch: pytest.MonkeyPatch, *, initialized: bool) -> list[object]:
    """Install a stand-in ``ray`` module that records which placement group it was asked about."""
    asked: list[object] = []
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: initialized  # type: ignore[attr-defined]
    ray.nodes = lambda: [{"NodeID": "ab" * 28, "Alive": True}]  # type: ignore[attr-defined]
    util = types.ModuleType("ray.util")

    def placement_group_table(pg: object) -> dict:
        asked.append(pg)
        return {"state": "CREATED", "bundles_to_node_id": {0: "cd" * 28}}

    util.placement_group_table = placement_group_table  # type: ignore[attr-defined]
    ray.util = util  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.util", util)
    return asked


@pytest.mark.parametrize("initialized", [True, False])
def test_is_initialized_asks_an_imported_ray(
    monkeypatch: pytest.MonkeyPatch, initialized: bool
) -> None:
    _stub_ray(monkeypatch, initialized=initialized)

    assert RayClusterView().is_initialized() is initialized


def test_nodes_and_placement_group_table_go_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _stub_ray(monkeypatch, initialized=True)
    view = RayClusterView()
    pg = object()

    assert view.nodes() == [{"NodeID": "ab" * 28, "Alive": True}]
    assert view.placement_group_table(pg)["bundles_to_node_id"] == {0: "cd" * 28}
    assert asked == [pg]


def test_fake_cluster_is_a_cluster_view() -> None:
    assert isinstance(FakeCluster(), ClusterView)
    assert isinstance(RayClusterView(), ClusterView)


def test_fake_cluster_nodes_have_rays_keys_and_lifecycle(fake_cluster: FakeCluster) -> None:
    node = fake_cluster.add_node(address="10.0.0.7", port=8080, hostname="worker-7")
    record = fake_cluster.nodes()[0]

    assert len(node) == 56 and int(node, 16) >= 0
    assert record["NodeID"] == node
    assert record["Alive"] is True
    assert record["NodeManagerAddress"] == "10.0.0.7"
    assert record["NodeManagerHostname"] == "worker-7"
    assert record["MetricsExportPort"] == 8080

    fake_cluster.kill_node(node)
    assert fake_cluster.nodes()[0]["Alive"] is False
    fake_cluster.remove_node(node)
    assert fake_cluster.nodes() == []
    with pytest.raises(KeyError, match=node):
        fake_cluster.kill_node(node)


def test_fake_cluster_returns_copies(fake_cluster: FakeCluster) -> None:
    fake_cluster.add_node()
    fake_cluster.nodes()[0]["Alive"] = False

    assert fake_cluster.nodes()[0]["Alive"] is True


def test_fake_cluster_initialised_flag(fake_cluster: FakeCluster) -> None:
    assert fake_cluster.is_initialized() is True
    fake_cluster.initialized = False
    assert fake_cluster.is_initialized() is False


def test_fake_placement_groups(fake_cluster: FakeCluster) -> None:
    a, b = fake_cluster.add_node(), fake_cluster.add_node()
    pg = fake_cluster.create_placement_group({0: a, 1: b, 2: ""}, state="PENDING")

    table = fake_cluster.placement_group_table(pg)
    assert table["state"] == "PENDING"
    assert table["bundles_to_node_id"] == {0: a, 1: b, 2: ""}
    assert table["placement_group_id"] == pg.id

    fake_cluster.set_placement_group_state(pg, "REMOVED")
    fake_cluster.move_bundle(pg, 2, a)
    table = fake_cluster.placement_group_table(pg)
    assert table["state"] == "REMOVED"
    assert table["bundles_to_node_id"][2] == a
    assert fake_cluster.placement_group_calls[pg.id] == 2


def test_fake_placement_group_failure_and_bad_state(fake_cluster: FakeCluster) -> None:
    pg = fake_cluster.create_placement_group({0: fake_cluster.add_node()})
    fake_cluster.fail_placement_group_table(pg, TimeoutError("gcs down"))

    with pytest.raises(TimeoutError, match="gcs down"):
        fake_cluster.placement_group_table(pg)
    fake_cluster.heal_placement_group_table(pg)
    assert fake_cluster.placement_group_table(pg)["state"] == "CREATED"

    with pytest.raises(ValueError, match=r"'DONE'.*CREATED"):
        fake_cluster.create_placement_group({}, state="DONE")


# The key-value store and job liveness -------------------------------------------------


def test_fake_cluster_key_value_store_and_jobs(fake_cluster: FakeCluster) -> None:
    from raylens.cluster import supports_key_value

    assert supports_key_value(fake_cluster)
    assert fake_cluster.job_id() == "01000000"
    assert fake_cluster.live_job_ids() == {"01000000"}

    fake_cluster.kv_put("placement/01000000", b"{}")
    fake_cluster.kv_put("other/1", b"x")
    assert fake_cluster.kv_get("placement/01000000") == b"{}"
    assert fake_cluster.kv_get("missing") is None
    assert fake_cluster.kv_keys("placement/") == ["placement/01000000"]
    fake_cluster.kv_delete("placement/01000000")
    fake_cluster.kv_delete("never-there")
    assert fake_cluster.kv_keys("placement/") == []

    second = fake_cluster.for_job("02000000")
    assert second.job_id() == "02000000"
    assert fake_cluster.live_job_ids() == {"01000000", "02000000"}
    second.kv_put("placement/02000000", b"[]")
    assert fake_cluster.kv_get("placement/02000000") == b"[]"  # one store for every job
    assert second.nodes() == fake_cluster.nodes()
    fake_cluster.end_job("02000000")
    assert fake_cluster.live_job_ids() == {"01000000"}
    assert fake_cluster.dead_job_ids() == {"02000000"}


def test_a_view_without_the_store_is_not_key_value_capable() -> None:
    from raylens.cluster import supports_key_value

    class Minimal:
        def is_initialized(self) -> bool:
            return True

        def nodes(self) -> list:
            return []

        def placement_group_table(self, pg: object) -> dict:
            return {}

    assert isinstance(Minimal(), ClusterView)
    assert not supports_key_value(Minimal())
    assert supports_key_value(RayClusterView())


def test_ray_view_stores_under_the_raylens_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    _stub_ray(monkeypatch, initialized=True)
    store: dict[tuple[bytes, str], bytes] = {}
    kv = types.ModuleType("ray.experimental.internal_kv")

    def put(key: bytes, value: bytes, overwrite: bool = True, *, namespace: str) -> bool:
        store[(key, namespace)] = value
        return True

    kv._internal_kv_put = put  # type: ignore[attr-defined]
    kv._internal_kv_get = lambda key, *, namespace: store.get((key, namespace))  # type: ignore[attr-defined]
    kv._internal_kv_del = lambda key, *, namespace: store.pop((key, namespace), None) and 1  # type: ignore[attr-defined]
    kv._internal_kv_list = lambda prefix, *, namespace: [  # type: ignore[attr-defined]
        k for (k, ns) in store if ns == namespace and k.startswith(prefix)
    ]
    experimental = types.ModuleType("ray.experimental")
    experimental.internal_kv = kv  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray.experimental", experimental)
    monkeypatch.setitem(sys.modules, "ray.experimental.internal_kv", kv)
    view = RayClusterView()

    view.kv_put("placement/01000000", b'{"a": []}')
    assert store == {(b"placement/01000000", "raylens"): b'{"a": []}'}
    assert view.kv_get("placement/01000000") == b'{"a": []}'
    assert view.kv_keys("placement/") == ["placement/01000000"]
    view.kv_delete("placement/01000000")
    assert store == {}


def test_ray_view_keys_that_are_not_utf8_reach_the_same_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _stub_ray(monkeypatch, initialized=True)
    store: dict[bytes, bytes] = {b"placement/\xff\xfe\x80": b"{}", b"placement/ok": b"[]"}
    kv = types.ModuleType("ray.experimental.internal_kv")
    kv._internal_kv_get = lambda key, *, namespace: store.get(key)  # type: ignore[attr-defined]
    kv._internal_kv_del = lambda key, *, namespace: store.pop(key, None) and 1  # type: ignore[attr-defined]
    kv._internal_kv_list = lambda prefix, *, namespace: [k for k in store if k.startswith(prefix)]  # type: ignore[attr-defined]
    experimental = types.ModuleType("ray.experimental")
    experimental.internal_kv = kv  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray.experimental", experimental)
    monkeypatch.setitem(sys.modules, "ray.experimental.internal_kv", kv)
    view = RayClusterView()

    odd = next(key for key in view.kv_keys("placement/") if key != "placement/ok")
    assert view.kv_get(odd) == b"{}"
    view.kv_delete(odd)
    assert store == {b"placement/ok": b"[]"}


def test_ray_call_errors_name_rays_own_errors_then_the_others_then_the_callers() -> None:
    fake = FakeRay()
    errors = ray_call_errors(fake, KeyError)
    assert errors[0] is fake.exceptions.RayError
    assert set(errors[1:]) == {RuntimeError, ValueError, TypeError, OSError, KeyError}
    # Every error the fake stands in for is one of them; a bug's error is not.
    assert issubclass(fake.exceptions.GetTimeoutError, errors)
    assert issubclass(fake.exceptions.RayActorError, errors)
    assert not issubclass(ZeroDivisionError, errors)


def test_ray_call_errors_without_a_ray_name_the_others_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert ray_call_errors() == (RuntimeError, ValueError, TypeError, OSError)
    stub = types.SimpleNamespace(exceptions=types.SimpleNamespace(RayError="not a class"))
    assert ray_call_errors(stub, AttributeError)[-1] is AttributeError
    assert len(ray_call_errors(stub)) == 4

"""Published placement entries written by a hostile or broken job cost only themselves.

Any job connected to the cluster can write any key of raylens' namespace in Ray's internal
key-value store. These tests write the entries such a job could: nested far past any
recursion limit, tens of megabytes, thousands of names, keys that are not UTF-8.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from raylens.cluster import RayClusterView
from raylens.telemetry.host_memory import _placement
from raylens.telemetry.host_memory._placement import (
    MAX_ENTRY_BYTES,
    MAX_GROUP_NAME_CHARS,
    MAX_GROUPS_PER_ENTRY,
    MAX_LABEL_CHARS,
    PLACEMENT_KEY_PREFIX,
    PlacementRegistry,
    check_group_name,
    format_worker_groups,
)
from raylens_fakes import FakeCluster, MetricsProbe, SimulatedCluster

LOGGER = "raylens.telemetry.host_memory"
NODE_A, NODE_B = "a" * 56, "b" * 56

Factory = Callable[..., SimulatedCluster]


def _key(job: str) -> str:
    return f"{PLACEMENT_KEY_PREFIX}{job}"


def _put(cluster: FakeCluster, job: str, payload: bytes) -> None:
    cluster.for_job(job).kv_put(_key(job), payload)


def _entry(groups: dict[str, list[str]]) -> bytes:
    return json.dumps(groups).encode()


def _warnings(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


def _labels(probe: MetricsProbe) -> dict[str, str]:
    probe.collect()
    return {
        dict(a)["ray.node.id"]: dict(a)["rl.worker_groups"]
        for a in probe.points("rl.host.memory.used")
    }


# One bad entry, however deep, costs only itself --------------------------------------


@pytest.mark.parametrize(
    "deep",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"policy": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a": ' * 100_000 + b"1" + b"}" * 100_000,
    ],
    ids=["array", "inside-a-group", "objects"],
)
def test_a_deeply_nested_entry_costs_only_itself(
    deep: bytes,
    simulated_cluster: Factory,
    metrics_probe: MetricsProbe,
    make_monitor: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = simulated_cluster(3)
    mover = PlacementRegistry(publish=True)
    mover_view = sim.cluster.for_job("0a000000")
    mover.register_nodes("policy", sim.node_ids[:1], cluster=mover_view)
    PlacementRegistry(publish=True).register_nodes(
        "critic", sim.node_ids[1:2], cluster=sim.cluster.for_job("0c000000")
    )
    watcher = make_monitor(sim.cluster)
    watcher.collect_once()
    assert _labels(metrics_probe) == dict(zip(sim.node_ids, ["policy", "critic", "none"]))

    _put(sim.cluster, "0b000000", deep)
    mover.forget("policy", cluster=mover_view)  # policy moves to rollout...
    mover.register_nodes("rollout", sim.node_ids[:1], cluster=mover_view)
    sim.cluster.end_job("0c000000")  # ...and critic's job ends
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        watcher.collect_once()
        watcher.collect_once()

    assert _labels(metrics_probe) == dict(zip(sim.node_ids, ["rollout", "none", "none"]))
    assert sim.cluster.kv_get(_key("0c000000")) is None
    (warned,) = _warnings(caplog, "0b000000")
    assert _key("0b000000") in warned and "nest" in warned
    assert warned.isprintable() and len(warned) < 400
    assert not any(r.exc_info for r in caplog.records if "0b000000" in r.getMessage())
    assert _warnings(caplog, "could not read") == []  # the refresh itself went through


def test_a_recursion_error_while_decoding_is_caught_per_entry(
    fake_cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(fake_cluster, "0b000000", _entry({"policy": [NODE_A]}))
    _put(fake_cluster, "0c000000", _entry({"critic": [NODE_B]}))
    real_loads = json.loads

    def loads(text: str | bytes, **kwargs: object) -> object:
        if "policy" in str(text):
            raise RecursionError("maximum recursion depth exceeded")
        return real_loads(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(json, "loads", loads)
    registry = PlacementRegistry()
    registry.refresh_published(fake_cluster)

    assert registry.published == {"critic": frozenset({NODE_B})}


# Size, names and label are bounded ------------------------------------------------------


def test_the_bounds_are_far_beyond_what_a_real_job_publishes() -> None:
    # 32 groups on 4,096 nodes each, names of a few hundred characters, fit every bound.
    assert 32 * 4096 * len(json.dumps("x" * 56) + ", ") <= MAX_ENTRY_BYTES
    assert MAX_GROUPS_PER_ENTRY >= 256 and MAX_GROUP_NAME_CHARS >= 256
    assert MAX_LABEL_CHARS >= 2048
    assert MAX_ENTRY_BYTES <= 16 * 1024 * 1024


def test_an_entry_over_the_size_bound_is_refused_before_it_is_decoded(
    fake_cluster: FakeCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    padding = "x" * (MAX_ENTRY_BYTES - 30)
    big = _entry({"policy": [NODE_A], "pad": [padding]})
    assert MAX_ENTRY_BYTES < len(big) < MAX_ENTRY_BYTES + 64
    _put(fake_cluster, "0b000000", big)
    _put(fake_cluster, "0c000000", _entry({"critic": [NODE_B]}))
    decoded: list[int] = []
    real_loads = json.loads

    def loads(text: str | bytes, **kwargs: object) -> object:
        decoded.append(len(text))
        return real_loads(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(json, "loads", loads)
    registry = PlacementRegistry()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        registry.refresh_published(fake_cluster)

    assert registry.published == {"critic": frozenset({NODE_B})}
    assert all(size < 1000 for size in decoded)  # the big one was never decoded
    (warned,) = _warnings(caplog, "0b000000")
    assert f"{len(big):,}" in warned and f"{MAX_ENTRY_BYTES:,}" in warned


def test_an_entry_of_exactly_the_size_bound_is_read(fake_cluster: FakeCluster) -> None:
    head = _entry({"policy": [NODE_A], "pad": [""]})
    exact = head.replace(b'[""]', b'["' + b"x" * (MAX_ENTRY_BYTES - len(head)) + b'"]')
    assert len(exact) == MAX_ENTRY_BYTES
    _put(fake_cluster, "0b000000", exact)
    registry = PlacementRegistry()
    registry.refresh_published(fake_cluster)
    assert registry.published["policy"] == frozenset({NODE_A})


def test_an_entry_naming_too_many_groups_is_refused(
    fake_cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    too_many = {f"group-{i:04d}": [NODE_A] for i in range(MAX_GROUPS_PER_ENTRY + 1)}
    _put(fake_cluster, "0b000000", _entry(too_many))
    _put(fake_cluster, "0c000000", _entry(dict(list(too_many.items())[:MAX_GROUPS_PER_ENTRY])))
    registry = PlacementRegistry()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        registry.refresh_published(fake_cluster)

    assert len(registry.published) == MAX_GROUPS_PER_ENTRY  # only the other job's
    (warned,) = _warnings(caplog, "0b000000")
    assert f"{MAX_GROUPS_PER_ENTRY + 1}" in warned and f"{MAX_GROUPS_PER_ENTRY}" in warned


def test_an_entry_with_an_overlong_group_name_is_refused(
    fake_cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    _put(fake_cluster, "0b000000", _entry({"p" * (MAX_GROUP_NAME_CHARS + 1): [NODE_A]}))
    _put(fake_cluster, "0c000000", _entry({"p" * MAX_GROUP_NAME_CHARS: [NODE_B]}))
    registry = PlacementRegistry()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        registry.refresh_published(fake_cluster)

    assert registry.published == {"p" * MAX_GROUP_NAME_CHARS: frozenset({NODE_B})}
    (warned,) = _warnings(caplog, "0b000000")
    assert f"{MAX_GROUP_NAME_CHARS}" in warned and len(warned) < 400


def test_a_group_name_longer_than_the_bound_is_refused_locally_too() -> None:
    assert check_group_name("p" * MAX_GROUP_NAME_CHARS) == "p" * MAX_GROUP_NAME_CHARS
    with pytest.raises(ValueError, match=f"{MAX_GROUP_NAME_CHARS + 1} characters.*at most"):
        check_group_name("p" * (MAX_GROUP_NAME_CHARS + 1))


def test_a_label_within_the_bound_is_unchanged() -> None:
    names = [f"g{i}" for i in range(100)]
    assert format_worker_groups(names) == ",".join(sorted(names))


def test_a_label_past_the_bound_is_cut_at_a_name_with_a_count_of_the_rest() -> None:
    names = [f"group-{i:03d}-" + "x" * 40 for i in range(300)]
    label = format_worker_groups(reversed(names))

    assert len(label) <= MAX_LABEL_CHARS
    kept, marker = label.rsplit(",", 1)
    kept_names = kept.split(",")
    assert kept_names == sorted(names)[: len(kept_names)]
    assert marker == f"(+{300 - len(kept_names)} more)"
    assert len(label) > MAX_LABEL_CHARS - 60  # as many names as fit
    assert format_worker_groups(names) == label  # the same whatever the order


def test_a_node_shared_by_many_jobs_gets_a_bounded_label(fake_cluster: FakeCluster) -> None:
    for job in range(20):
        names = {f"j{job:02d}-" + "n" * 200 + f"{i:03d}": [NODE_A] for i in range(50)}
        _put(fake_cluster, f"{0x10000000 + job:08x}", _entry(names))
    registry = PlacementRegistry()
    registry.refresh_published(fake_cluster)

    label = format_worker_groups(registry.names_on_node(NODE_A))
    assert len(label) <= MAX_LABEL_CHARS and label.endswith(" more)")


def test_a_publisher_past_the_bounds_warns_and_publishes_nothing(
    fake_cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    registry = PlacementRegistry(publish=True)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for i in range(MAX_GROUPS_PER_ENTRY + 1):
            registry.register_nodes(f"g{i}", [NODE_A], cluster=fake_cluster)

    assert fake_cluster.kv_get(_key(FakeCluster.DEFAULT_JOB_ID)) is None
    (warned,) = _warnings(caplog, "not published")
    assert f"{MAX_GROUPS_PER_ENTRY + 1} worker groups" in warned
    assert registry.names_on_node(NODE_A) == {f"g{i}" for i in range(MAX_GROUPS_PER_ENTRY + 1)}


# A refresh costs per changed entry --------------------------------------------------------


def test_unchanged_entries_are_not_decoded_again(
    fake_cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(fake_cluster, "0b000000", _entry({"policy": [NODE_A]}))
    _put(fake_cluster, "0c000000", _entry({"critic": [NODE_B]}))
    decoded: list[str] = []
    real_loads = json.loads

    def loads(text: str | bytes, **kwargs: object) -> object:
        decoded.append(text if isinstance(text, str) else text.decode())
        return real_loads(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(json, "loads", loads)
    registry = PlacementRegistry()
    registry.refresh_published(fake_cluster)
    assert len(decoded) == 2
    for _ in range(5):
        registry.refresh_published(fake_cluster)
    assert len(decoded) == 2

    _put(fake_cluster, "0c000000", _entry({"critic": [NODE_A, NODE_B]}))
    registry.refresh_published(fake_cluster)
    assert len(decoded) == 3 and "critic" in decoded[-1]
    assert registry.published == {
        "policy": frozenset({NODE_A}),
        "critic": frozenset({NODE_A, NODE_B}),
    }

    fake_cluster.end_job("0b000000")
    registry.refresh_published(fake_cluster)
    assert len(decoded) == 3
    assert registry.published == {"critic": frozenset({NODE_A, NODE_B})}


def test_a_refused_entry_is_warned_about_once_and_not_decoded_again(
    fake_cluster: FakeCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _put(fake_cluster, "0b000000", b'{"policy": "not a list"}')
    calls: list[object] = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, **kw: calls.append(text) or real_loads(text))
    registry = PlacementRegistry()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            registry.refresh_published(fake_cluster)

    assert len(calls) == 1 and registry.published == {}
    assert len(_warnings(caplog, "0b000000")) == 1


def test_clear_forgets_what_was_read(fake_cluster: FakeCluster) -> None:
    _put(fake_cluster, "0b000000", _entry({"policy": [NODE_A]}))
    registry = PlacementRegistry()
    registry.refresh_published(fake_cluster)
    registry.clear()
    assert registry.published == {}
    registry.refresh_published(fake_cluster)
    assert registry.published == {"policy": frozenset({NODE_A})}


# Keys that are not UTF-8 -----------------------------------------------------------------


class RayKV:
    """What the stand-in ``ray`` holds: its internal KV (raylens' namespace) and every delete."""

    def __init__(self) -> None:
        self.store: dict[bytes, bytes] = {}
        self.deletes: list[bytes] = []

    def put(self, key: bytes, value: bytes, overwrite: bool = True, *, namespace: str) -> None:
        self.store[key] = value

    def get(self, key: bytes, *, namespace: str) -> bytes | None:
        return self.store.get(key)

    def delete(self, key: bytes, *, namespace: str) -> int:
        assert namespace == "raylens" and isinstance(key, bytes)
        self.deletes.append(key)
        return 1 if self.store.pop(key, None) is not None else 0

    def keys(self, prefix: bytes, *, namespace: str) -> list[bytes]:
        return [key for key in self.store if key.startswith(prefix)]


@pytest.fixture
def ray_kv(monkeypatch: pytest.MonkeyPatch) -> RayKV:
    """A stand-in ``ray`` over a :class:`RayKV`, for :class:`RayClusterView`.

    This process runs job ``01000000``; jobs ``01000000`` and ``0b000000`` are alive.
    """
    fake = RayKV()
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: True  # type: ignore[attr-defined]
    context = types.SimpleNamespace(get_job_id=lambda: "01000000")
    ray.get_runtime_context = lambda: context  # type: ignore[attr-defined]
    private = types.ModuleType("ray._private")
    state = types.ModuleType("ray._private.state")
    state.jobs = lambda: [  # type: ignore[attr-defined]
        {"JobID": "01000000", "IsDead": False},
        {"JobID": "0b000000", "IsDead": False},
    ]
    private.state = state  # type: ignore[attr-defined]
    kv = types.ModuleType("ray.experimental.internal_kv")
    kv._internal_kv_put = fake.put  # type: ignore[attr-defined]
    kv._internal_kv_get = fake.get  # type: ignore[attr-defined]
    kv._internal_kv_del = fake.delete  # type: ignore[attr-defined]
    kv._internal_kv_list = fake.keys  # type: ignore[attr-defined]
    experimental = types.ModuleType("ray.experimental")
    experimental.internal_kv = kv  # type: ignore[attr-defined]
    for name, module in {
        "ray": ray,
        "ray._private": private,
        "ray._private.state": state,
        "ray.experimental": experimental,
        "ray.experimental.internal_kv": kv,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return fake


def test_keys_that_are_not_utf8_are_deleted_once(ray_kv: RayKV) -> None:
    prefix = PLACEMENT_KEY_PREFIX.encode()
    for i in range(3000):
        ray_kv.store[prefix + b"\xff\xfe" + i.to_bytes(2, "big") + b"\x80"] = b"{}"
    ray_kv.store[prefix + b"0b000000"] = _entry({"policy": [NODE_A]})
    registry = PlacementRegistry()

    registry.refresh_published(RayClusterView())
    assert list(ray_kv.store) == [prefix + b"0b000000"]
    assert len(ray_kv.deletes) == 3000
    assert registry.published == {"policy": frozenset({NODE_A})}

    registry.refresh_published(RayClusterView())
    assert len(ray_kv.deletes) == 3000  # nothing left to delete


# Trust boundary, documented ----------------------------------------------------------------


def test_the_readme_trust_table_lists_the_key_value_store_and_its_bounds() -> None:
    readme = (Path(__file__).resolve().parents[4] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Trust boundaries", 1)[1].split("\n## ", 1)[0]
    (row,) = [line for line in section.splitlines() if "key-value store" in line]
    assert "any job" in row.lower() and "forge" in row
    for figure in (
        f"{MAX_ENTRY_BYTES // (1024 * 1024)} MiB",
        f"{MAX_GROUPS_PER_ENTRY} ",
        f"{MAX_GROUP_NAME_CHARS} characters",
        f"{MAX_LABEL_CHARS:,} characters",
    ):
        assert figure in row, figure


def test_the_module_documents_its_bounds() -> None:
    doc = _placement.__doc__ or ""
    for name in (
        "MAX_ENTRY_BYTES",
        "MAX_GROUPS_PER_ENTRY",
        "MAX_GROUP_NAME_CHARS",
        "MAX_LABEL_CHARS",
    ):
        assert name in doc, name

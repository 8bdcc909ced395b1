"""FakeCluster: a scripted :class:`raylens.cluster.ClusterView`.

Nodes and placement groups are plain records the test edits: add a node, kill it,
remove it, create a placement group in any state with any bundle-to-node map,
make the placement-group lookup fail. The shapes returned are Ray's, so code under
test cannot tell it from :class:`raylens.cluster.RayClusterView`. It also has the
optional shared key-value store and a job table; :meth:`FakeCluster.for_job` gives
another process's view of the same cluster (same nodes and store, its own job id).
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FakeCluster", "FakePlacementGroup"]

PLACEMENT_GROUP_STATES = frozenset({"PENDING", "PREPARED", "CREATED", "RESCHEDULING", "REMOVED"})


@dataclass(eq=False)
class FakePlacementGroup:
    """A placement-group handle, as :meth:`FakeCluster.create_placement_group` returns.

    Hashable by identity, like a Ray placement group is by id. ``bundle_count``
    is the number of bundles it was created with.
    """

    id: str
    bundle_count: int
    name: str = ""

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakePlacementGroup) and other.id == self.id


class FakeCluster:
    """An in-memory cluster: nodes and placement groups that a test scripts.

    ``is_initialized`` starts True and can be set. Every method is thread-safe.
    ``placement_group_calls`` counts :meth:`placement_group_table` calls per group id.
    This view's own job, ``01000000``, is alive from the start.
    """

    #: This view's job id, like Ray's (hex, four bytes).
    DEFAULT_JOB_ID = "01000000"

    def __init__(self, *, initialized: bool = True) -> None:
        self.initialized = initialized
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._groups: dict[str, dict[str, Any]] = {}
        self._failing: dict[str, BaseException] = {}
        self._raw_records: list[Any] = []
        self._ports = itertools.count(40000)
        self.placement_group_calls: dict[str, int] = {}
        self.nodes_calls = 0
        self._kv: dict[str, bytes] = {}
        self._jobs: dict[str, bool] = {self.DEFAULT_JOB_ID: True}
        self._job_id = self.DEFAULT_JOB_ID
        #: Set to an exception to make every key-value call raise it.
        self.kv_error: BaseException | None = None

    # ClusterView -----------------------------------------------------------------

    def is_initialized(self) -> bool:
        return self.initialized

    def nodes(self) -> list[dict[str, Any]]:
        with self._lock:
            self.nodes_calls += 1
            return [*self._raw_records, *(dict(node) for node in self._nodes.values())]

    def add_raw_record(self, record: object) -> None:
        """List ``record`` exactly as given, before the regular nodes, on every :meth:`nodes`.

        For records the GCS should never send: ``None``, an unhashable ``NodeID``, an
        address that is not a string. Code under test must survive them.
        """
        with self._lock:
            self._raw_records.append(record)

    def placement_group_table(self, placement_group: Any) -> dict[str, Any]:
        pg_id = getattr(placement_group, "id", placement_group)
        with self._lock:
            self.placement_group_calls[pg_id] = self.placement_group_calls.get(pg_id, 0) + 1
            error = self._failing.get(pg_id)
            record = self._groups.get(pg_id)
            if error is not None:
                raise error
            if record is None:
                return {}
            return {
                **record,
                "bundles": dict(record["bundles"]),
                "bundles_to_node_id": dict(record["bundles_to_node_id"]),
            }

    # The shared key-value store and the job table ----------------------------------

    def kv_put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._kv_check()
            self._kv[key] = bytes(value)

    def kv_get(self, key: str) -> bytes | None:
        with self._lock:
            self._kv_check()
            return self._kv.get(key)

    def kv_delete(self, key: str) -> None:
        with self._lock:
            self._kv_check()
            self._kv.pop(key, None)

    def kv_keys(self, prefix: str) -> list[str]:
        with self._lock:
            self._kv_check()
            return sorted(key for key in self._kv if key.startswith(prefix))

    def job_id(self) -> str | None:
        return self._job_id

    def live_job_ids(self) -> set[str]:
        with self._lock:
            self._kv_check()
            return {job for job, alive in self._jobs.items() if alive}

    def dead_job_ids(self) -> set[str]:
        """Jobs the table lists as ended."""
        with self._lock:
            return {job for job, alive in self._jobs.items() if not alive}

    def for_job(self, job_id: str) -> FakeCluster:
        """Another process's view: the same nodes, groups and store, job ``job_id`` (now alive)."""
        other = FakeCluster.__new__(FakeCluster)
        other.__dict__.update(self.__dict__)  # shares every table and the lock
        other._job_id = job_id
        with self._lock:
            self._jobs[job_id] = True
        return other

    def end_job(self, job_id: str) -> None:
        """Mark ``job_id``'s driver as exited, as the GCS does when a driver dies."""
        with self._lock:
            self._jobs[job_id] = False

    def _kv_check(self) -> None:
        if self.kv_error is not None:
            raise self.kv_error

    # Nodes -------------------------------------------------------------------------

    def add_node(
        self,
        *,
        address: str = "127.0.0.1",
        port: int | None = None,
        hostname: str | None = None,
        node_id: str | None = None,
        alive: bool = True,
        head: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Add a node and return its id (56 hex characters, like Ray's).

        ``port`` is the metrics export port; ``None`` picks an unused-looking
        number, and ``-1`` means the node exports no metrics (plain ``pip install
        ray``). ``extra`` adds or overrides keys of the node record.
        """
        node_id = node_id or secrets.token_hex(28)
        with self._lock:
            if node_id in self._nodes:
                raise ValueError(f"node id {node_id!r} is already in this cluster")
            metrics_port = next(self._ports) if port is None else port
            record: dict[str, Any] = {
                "NodeID": node_id,
                "Alive": alive,
                "alive": alive,
                "NodeManagerAddress": address,
                "NodeManagerHostname": hostname if hostname is not None else "fake-host",
                "NodeManagerPort": 0,
                "ObjectManagerPort": 0,
                "MetricsExportPort": metrics_port,
                "NodeName": address,
                "Resources": {"CPU": 1.0, f"node:{address}": 1.0},
                "Labels": {"ray.io/node-id": node_id},
                "IsHeadNode": head,
            }
            if extra:
                record.update(extra)
            self._nodes[node_id] = record
        return node_id

    def kill_node(self, node_id: str) -> None:
        """Mark a node dead (``Alive`` False); it stays in :meth:`nodes`, as in Ray."""
        with self._lock:
            record = self._node(node_id)
            record["Alive"] = False
            record["alive"] = False

    def revive_node(self, node_id: str) -> None:
        """Mark a dead node alive again."""
        with self._lock:
            record = self._node(node_id)
            record["Alive"] = True
            record["alive"] = True

    def remove_node(self, node_id: str) -> None:
        """Drop a node from :meth:`nodes` altogether."""
        with self._lock:
            self._node(node_id)
            del self._nodes[node_id]

    def update_node(self, node_id: str, **fields: Any) -> None:
        """Set keys of a node's record, e.g. ``MetricsExportPort=-1``."""
        with self._lock:
            self._node(node_id).update(fields)

    def node_ids(self) -> list[str]:
        """Ids of every node, dead ones included, in the order they were added."""
        with self._lock:
            return list(self._nodes)

    def _node(self, node_id: str) -> dict[str, Any]:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in this cluster") from None

    # Placement groups ------------------------------------------------------------

    def create_placement_group(
        self,
        bundles_to_node_id: Mapping[int, str],
        *,
        state: str = "CREATED",
        name: str = "",
        strategy: str = "PACK",
    ) -> FakePlacementGroup:
        """Create a placement group whose bundle ``i`` sits on ``bundles_to_node_id[i]``.

        A node id of ``""`` means the bundle has not been placed. ``state`` is one
        of Ray's placement-group states.
        """
        self._check_state(state)
        pg = FakePlacementGroup(
            id=secrets.token_hex(14), bundle_count=len(bundles_to_node_id), name=name
        )
        with self._lock:
            self._groups[pg.id] = {
                "placement_group_id": pg.id,
                "name": name,
                "bundles": {int(i): {"CPU": 1.0} for i in bundles_to_node_id},
                "bundles_to_node_id": {int(i): n for i, n in bundles_to_node_id.items()},
                "strategy": strategy,
                "state": state,
                "stats": {"scheduling_attempt": 1, "scheduling_state": "FINISHED"},
            }
        return pg

    def set_placement_group_state(self, pg: FakePlacementGroup, state: str) -> None:
        """Move ``pg`` to another state; its bundle map is kept, as Ray keeps stale ids."""
        self._check_state(state)
        with self._lock:
            self._group(pg)["state"] = state

    def move_bundle(self, pg: FakePlacementGroup, bundle_index: int, node_id: str) -> None:
        """Place bundle ``bundle_index`` of ``pg`` on ``node_id``."""
        with self._lock:
            record = self._group(pg)
            record["bundles_to_node_id"][int(bundle_index)] = node_id
            record["bundles"].setdefault(int(bundle_index), {"CPU": 1.0})

    def fail_placement_group_table(
        self, pg: FakePlacementGroup, error: BaseException | None = None
    ) -> None:
        """Make :meth:`placement_group_table` raise ``error`` (default RuntimeError) for ``pg``."""
        with self._lock:
            self._failing[pg.id] = error or RuntimeError(f"GCS lookup of {pg.id} failed")

    def heal_placement_group_table(self, pg: FakePlacementGroup) -> None:
        """Undo :meth:`fail_placement_group_table`."""
        with self._lock:
            self._failing.pop(pg.id, None)

    def _group(self, pg: FakePlacementGroup) -> dict[str, Any]:
        try:
            return self._groups[pg.id]
        except KeyError:
            raise KeyError(f"no placement group {pg.id!r} in this cluster") from None

    @staticmethod
    def _check_state(state: str) -> None:
        if state not in PLACEMENT_GROUP_STATES:
            raise ValueError(
                f"placement group state {state!r} is not one of "
                f"{', '.join(sorted(PLACEMENT_GROUP_STATES))}"
            )

    def __repr__(self) -> str:
        return f"FakeCluster(nodes={len(self._nodes)}, placement_groups={len(self._groups)})"

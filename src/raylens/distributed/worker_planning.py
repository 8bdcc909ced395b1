"""Who runs what in a worker group, and with which environment, decided without Ray.

A :class:`~raylens.distributed.worker_groups.RayWorkerGroup` decides here, before it
creates an actor and again at each dispatch: the environment a worker and its initializer
get (inherited driver variables, the group's ``env_vars``, ``RANK``, ``WORLD_SIZE``...),
each requested bundle's plan (rank, tied group, node rank, local rank, actor name), the
data-parallel leaders, which workers a call reaches with which slice of data, and which
results come back, one per tied group.

Invariants: plain Python over plain data, so nothing here imports Ray or waits on a
cluster; a layout or argument a caller got wrong raises ValueError naming the value, before
any actor starts.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raylens.distributed.named_sharding import NamedSharding

__all__ = ["DISTRIBUTED_ENV_VARS", "DispatchLengthError", "WorkerIndexError"]


class WorkerIndexError(IndexError, ValueError):
    """A worker or data-parallel shard index outside the group.

    An ``IndexError``, as NeMo-RL raises, and a ``ValueError`` like raylens' other
    argument errors.
    """


class DispatchLengthError(AssertionError, ValueError):
    """A per-worker argument with a different number of entries than workers called.

    An ``AssertionError``, as NeMo-RL raises, and a ``ValueError`` like raylens' other
    argument errors.
    """


# =========================================================================================
# Environment
# =========================================================================================

#: Variables every worker receives from its group; they describe the worker's place in
#: the distributed job.
DISTRIBUTED_ENV_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)

# Driver variables that describe the driver process or its node, not the job, and so
# are not forwarded to workers: device visibility is assigned per bundle by Ray, and
# the rest would point a worker at the driver's session or shell.
_DRIVER_ONLY_ENV_VARS = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "NEURON_RT_VISIBLE_CORES",
        "TPU_VISIBLE_CHIPS",
        "ONEAPI_DEVICE_SELECTOR",
        "RAY_ADDRESS",
        "RAY_CLIENT_MODE",
        "RAY_JOB_ID",
        "RAY_RAYLET_PID",
        "RAY_NODE_ID",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "PYTEST_CURRENT_TEST",
    }
)


def _checked_env_vars(env_vars: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``env_vars``; ValueError naming any key or value that is not a string."""
    if env_vars is None:
        return {}
    if not isinstance(env_vars, Mapping):
        raise ValueError(f"env_vars must be a mapping of str to str, got {env_vars!r}")
    for key, value in env_vars.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"env_vars must map str to str; the entry {key!r}: {value!r} does not")
    return dict(env_vars)


def _driver_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment as workers inherit it: everything but driver-only entries."""
    source = os.environ if environ is None else environ
    return {
        key: value
        for key, value in source.items()
        if key not in _DRIVER_ONLY_ENV_VARS and key not in DISTRIBUTED_ENV_VARS
    }


def _worker_env_vars(
    driver_env: Mapping[str, str],
    group_env: Mapping[str, str],
    distributed: Mapping[str, str],
) -> dict[str, str]:
    """One worker's environment, lowest precedence first: driver, group, distributed.

    The worker class's ``configure_worker`` is applied later, inside the initializer,
    and wins over all three.
    """
    env = dict(driver_env)
    env.update(group_env)
    env.update(distributed)
    return env


def _get_initializer_env_vars(env_vars: dict[str, str]) -> dict[str, str]:
    """The environment of the initializer actor that creates workers with ``env_vars``.

    The initializer unpickles the worker's constructor arguments and imports the
    worker class, so it needs the worker's environment (import paths and any
    variable a library reads at import time). It is not itself a rank of the job,
    though, so the per-worker distributed variables are left out: a library imported
    while unpickling must not believe it is part of the process group. Returns a new
    dict; ``env_vars`` is not modified.
    """
    return {key: value for key, value in env_vars.items() if key not in DISTRIBUTED_ENV_VARS}


# =========================================================================================
# Worker plans and tied groups
# =========================================================================================


@dataclass(frozen=True)
class _WorkerPlan:
    """Where one worker goes and who it is, decided before anything is created."""

    global_rank: int
    tied_group_idx: int
    member_idx: int
    node_idx: int  # first node of the worker's tied group, as given by the caller
    local_bundle_idx: int  # local index as given (may spill past node_idx's bundles)
    node_rank: int  # logical node the worker's bundle is on
    local_rank: int  # index of the worker's bundle on that node
    bundle_indices: tuple[int, list[int]] | None  # set on tied-group leaders only
    name: str


def _bundle_indices_from_workers_per_node(
    workers_per_node: int | Sequence[int] | None, bundle_ct_per_node_list: Sequence[int]
) -> list[tuple[int, list[int]]]:
    """One single-worker tied group per requested bundle, node by node.

    Nodes are those of ``bundle_ct_per_node_list`` that hold bundles, one placement
    group each, so an empty node takes no index. ``None`` means one worker per bundle;
    an int asks for that many on every node; a list gives the count per node (a list
    with one entry per logical node, empty ones included as 0, is accepted too).
    """
    full = list(bundle_ct_per_node_list)
    counts = [count for count in full if count > 0]
    if workers_per_node is None:
        per_node = counts
    elif isinstance(workers_per_node, bool):
        raise ValueError(f"workers_per_node must be an int or a list, got {workers_per_node!r}")
    elif isinstance(workers_per_node, int):
        per_node = [workers_per_node] * len(counts)
    elif isinstance(workers_per_node, (list, tuple)):
        per_node = list(workers_per_node)
        if len(per_node) == len(full) != len(counts) and all(
            wanted == 0 for wanted, count in zip(per_node, full) if count == 0
        ):
            per_node = [wanted for wanted, count in zip(per_node, full) if count > 0]
        if len(per_node) != len(counts):
            raise ValueError(
                f"workers_per_node has {len(workers_per_node)} entries but the cluster has "
                f"{len(counts)} placement groups (one per node holding bundles: {full}); "
                "give one count per placement group"
            )
    else:
        raise ValueError(f"workers_per_node must be an int or a list, got {workers_per_node!r}")
    for node_idx, (wanted, available) in enumerate(zip(per_node, counts)):
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
            raise ValueError(
                f"workers_per_node asks for {wanted!r} workers on node {node_idx}; "
                "counts must be non-negative integers"
            )
        if wanted > available:
            raise ValueError(
                f"workers_per_node asks for {wanted} workers on node {node_idx}, which has "
                f"only {available} bundles"
            )
    plan = [
        (node_idx, [local_idx])
        for node_idx, wanted in enumerate(per_node)
        for local_idx in range(wanted)
    ]
    if not plan:
        raise ValueError(f"workers_per_node={workers_per_node!r} asks for no workers at all")
    return plan


def _normalized_bundle_indices_list(bundle_indices_list: object) -> list[tuple[int, list[int]]]:
    """``bundle_indices_list`` as ``[(node_idx, [local indices])]``; ValueError if malformed."""
    if not isinstance(bundle_indices_list, (list, tuple)) or not bundle_indices_list:
        raise ValueError(
            "bundle_indices_list must be a non-empty list of (node_idx, [local bundle "
            f"indices]) tuples, got {bundle_indices_list!r}"
        )
    normalized: list[tuple[int, list[int]]] = []
    for entry in bundle_indices_list:
        ok = isinstance(entry, (list, tuple)) and len(entry) == 2
        if ok:
            node_idx, local = entry
            ok = (
                isinstance(node_idx, int)
                and not isinstance(node_idx, bool)
                and isinstance(local, (list, tuple))
                and len(local) > 0
                and all(isinstance(i, int) and not isinstance(i, bool) for i in local)
            )
        if not ok:
            raise ValueError(
                f"bundle_indices_list entry {entry!r} is not (node_idx, [local bundle "
                "indices]) with integer indices and at least one bundle"
            )
        normalized.append((node_idx, list(local)))
    return normalized


def _plan_workers(
    bundle_indices_list: Sequence[tuple[int, Sequence[int]]],
    locate: Callable[[int, int], tuple[int, int]],
    name_prefix: str,
) -> list[_WorkerPlan]:
    """Give every requested bundle a rank, a tied group, a node rank and a name.

    ``locate(node_idx, local_idx)`` returns ``(logical node, index on that node)`` and
    raises ValueError for a bundle that does not exist. Ranks are assigned in the
    order of ``bundle_indices_list``; each entry is one tied group whose first worker
    is its leader. A bundle may appear only once.
    """
    plans: list[_WorkerPlan] = []
    seen: dict[tuple[int, int], int] = {}
    for group_idx, (node_idx, local_indices) in enumerate(bundle_indices_list):
        tied = len(local_indices) > 1
        for member_idx, local_idx in enumerate(local_indices):
            node_rank, local_rank = locate(node_idx, local_idx)
            place = (node_rank, local_rank)
            if place in seen:
                raise ValueError(
                    f"bundle ({node_idx}, {local_idx}) is node {node_rank}'s bundle "
                    f"{local_rank}, already given to worker {seen[place]}; each bundle "
                    "may hold one worker of a group"
                )
            rank = len(plans)
            seen[place] = rank
            if tied:
                name = f"{name_prefix}-grp{group_idx}-{member_idx}"
            else:
                name = f"{name_prefix}-{node_idx}-{local_idx}"
            plans.append(
                _WorkerPlan(
                    global_rank=rank,
                    tied_group_idx=group_idx,
                    member_idx=member_idx,
                    node_idx=node_idx,
                    local_bundle_idx=local_idx,
                    node_rank=node_rank,
                    local_rank=local_rank,
                    bundle_indices=(node_idx, list(local_indices)) if member_idx == 0 else None,
                    name=name,
                )
            )
    return plans


class _DefaultNames:
    """Names handed to groups built without a ``name_prefix``, unique among live groups.

    A group is named after its worker class, so its labels and environment read the
    same on every run; a second live group of the same class gets ``-2``, and so on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: set[str] = set()

    def take(self, builder: object) -> str:
        label = str(getattr(builder, "ray_actor_class_fqn", "") or "")
        base = label.rsplit(".", 1)[-1].replace(",", "_") or "workers"
        if base == "none":
            base = "workers"
        with self._lock:
            name, suffix = base, 2
            while name in self._taken:
                name, suffix = f"{base}-{suffix}", suffix + 1
            self._taken.add(name)
        return name

    def release(self, name: str) -> None:
        with self._lock:
            self._taken.discard(name)


_DEFAULT_NAMES = _DefaultNames()


def _check_sharding_covers_workers(sharding: NamedSharding | None, num_workers: int) -> None:
    """A group's sharding must hold exactly the ranks ``0..num_workers-1``."""
    if sharding is None:
        return
    ranks = sorted(sharding.get_ranks_by_coord())
    if ranks != list(range(num_workers)):
        raise ValueError(
            f"sharding_annotations covers {sharding.size} ranks ({sharding.shape}) but the "
            f"group has {num_workers} workers; its layout must hold the ranks "
            f"0..{num_workers - 1} exactly once"
        )


def _tied_groups(plans: Sequence[_WorkerPlan]) -> tuple[list[list[int]], dict[int, int]]:
    """``(tied_workers_groups, worker_to_tied_group_index)`` from worker plans."""
    groups: list[list[int]] = []
    index: dict[int, int] = {}
    for plan in plans:
        while len(groups) <= plan.tied_group_idx:
            groups.append([])
        groups[plan.tied_group_idx].append(plan.global_rank)
        index[plan.global_rank] = plan.tied_group_idx
    return groups, index


# =========================================================================================
# Data-parallel leaders
# =========================================================================================


def _check_dp_leader_worker_indices(requested: list[int], tied_group_leaders: list[int]) -> None:
    """Reject data-parallel leaders that are not an ascending subset of the group leaders.

    Every shard-level call goes to a DP leader, so a leader must be a worker that owns
    a model: the first worker of a tied group. Checking here turns a wrong layout into
    an error at startup rather than calls reaching a worker that built nothing.
    """
    if not isinstance(requested, (list, tuple)) or not requested:
        raise ValueError(
            f"dp_leader_worker_indices must be a non-empty list of worker indices, got "
            f"{requested!r}"
        )
    bad_type = [i for i in requested if isinstance(i, bool) or not isinstance(i, int)]
    if bad_type:
        raise ValueError(f"dp_leader_worker_indices must hold integers; got {bad_type}")
    leaders = set(tied_group_leaders)
    not_leaders = [i for i in requested if i not in leaders]
    if not_leaders:
        raise ValueError(
            f"dp_leader_worker_indices {not_leaders} are not tied-group leaders; a DP "
            f"leader must be one of {sorted(leaders)}"
        )
    out_of_order = [
        later for earlier, later in itertools.pairwise(requested) if not later > earlier
    ]
    if out_of_order:
        raise ValueError(
            f"dp_leader_worker_indices must be strictly ascending; {out_of_order} come "
            f"after an equal or larger index in {list(requested)}"
        )


def _dp_shard_of_workers(num_workers: int, dp_leaders: Sequence[int]) -> list[int | None]:
    """The DP shard of each worker: shard ``j`` runs from leader ``j`` up to the next leader.

    Workers before the first leader belong to no shard (None).
    """
    shards: list[int | None] = []
    for worker_idx in range(num_workers):
        shard = None
        for shard_idx, leader in enumerate(dp_leaders):
            if worker_idx < leader:
                break
            shard = shard_idx
        shards.append(shard)
    return shards


# =========================================================================================
# Dispatch routing
# =========================================================================================


def _check_axes(sharding: NamedSharding, axes: Iterable[str], argument: str) -> list[str]:
    """``axes`` as a list; ValueError for one the sharding lacks or one named twice."""
    axes = list(axes)
    unknown = [axis for axis in axes if axis not in sharding.names]
    if unknown:
        raise ValueError(
            f"{argument} names {unknown}, which are not axes of this group's sharding "
            f"{sharding.names}"
        )
    repeated = sorted({axis for axis in axes if axes.count(axis) > 1})
    if repeated:
        raise ValueError(f"{argument} lists {repeated} more than once")
    return axes


def _rank0_only_workers(
    sharding: NamedSharding | None, num_workers: int, run_rank_0_only_axes: Sequence[str] | None
) -> list[int]:
    """Workers to call: all of them, less those off index 0 of any rank-0-only axis."""
    if not run_rank_0_only_axes:
        return list(range(num_workers))
    if sharding is None:
        raise ValueError(
            f"run_rank_0_only_axes={list(run_rank_0_only_axes)} needs a group built with "
            "sharding_annotations"
        )
    axes = _check_axes(sharding, run_rank_0_only_axes, "run_rank_0_only_axes")
    selected = []
    for worker_idx in range(num_workers):
        coords = sharding.get_worker_coords(worker_idx)
        if all(coords[axis] == 0 for axis in axes):
            selected.append(worker_idx)
    return selected


@dataclass(frozen=True)
class _ShardedCall:
    """One call of a sharded dispatch: the worker, and which data slice it gets.

    ``data_coords`` holds the worker's index along each in-sharded axis, in the order
    the axes were given; ``None`` marks a dummy call whose arguments are all None.
    """

    worker_idx: int
    data_coords: tuple[int, ...] | None


def _plan_sharded_calls(
    sharding: NamedSharding,
    in_sharded_axes: Sequence[str] | None,
    replicate_on_axes: Sequence[str] | None,
    output_is_replicated: Sequence[str] | None,
    make_dummy_calls_to_free_axes: bool,
) -> tuple[list[_ShardedCall], list[int]]:
    """Which workers a sharded dispatch calls, with what, and whose results come back.

    An axis is *sharded* (each index gets its own slice), *replicated* (every index
    gets the same slice) or *free* (neither: only index 0 gets data). A worker off
    index 0 of a free axis is skipped, or given a dummy call when
    ``make_dummy_calls_to_free_axes``; its result is never returned. A worker off
    index 0 of an ``output_is_replicated`` axis is called but its result is not
    returned either, since index 0 returns the same thing.
    """
    sharded = _check_axes(sharding, in_sharded_axes or [], "in_sharded_axes")
    replicated = _check_axes(sharding, replicate_on_axes or [], "replicate_on_axes")
    output_replicated = _check_axes(sharding, output_is_replicated or [], "output_is_replicated")
    both = [axis for axis in sharded if axis in replicated]
    if both:
        raise ValueError(
            f"axes {both} are in both in_sharded_axes and replicate_on_axes; an axis is "
            "either sharded or replicated"
        )
    free = [axis for axis in sharding.names if axis not in sharded and axis not in replicated]
    calls: list[_ShardedCall] = []
    returned: list[int] = []
    for worker_idx in range(sharding.size):
        coords = sharding.get_worker_coords(worker_idx)
        if any(coords[axis] != 0 for axis in free):
            if make_dummy_calls_to_free_axes:
                calls.append(_ShardedCall(worker_idx, None))
            continue
        calls.append(_ShardedCall(worker_idx, tuple(coords[axis] for axis in sharded)))
        if all(coords[axis] == 0 for axis in output_replicated):
            returned.append(worker_idx)
    return calls, returned


def _slice_sharded(
    value: Any,
    axes: Sequence[str],
    coords: Sequence[int],
    sharding: NamedSharding,
    label: str,
) -> Any:
    """Index ``value`` by ``coords`` along ``axes`` in turn, checking each level's length."""
    for axis, index in zip(axes, coords):
        size = sharding.get_axis_size(axis)
        try:
            length = len(value)
        except TypeError:
            raise ValueError(
                f"{label} must be a sequence with one entry per index of axis {axis!r} "
                f"({size}), got {type(value).__name__}"
            ) from None
        if length != size:
            raise ValueError(
                f"{label} has {length} entries along axis {axis!r}, which has size {size}; "
                "give one entry per shard"
            )
        value = value[index]
    return value


def _check_multiple_data_lengths(
    args: Sequence[Any], kwargs: Mapping[str, Any], num_workers: int
) -> None:
    """Every per-worker argument must hold exactly one entry per called worker.

    ``num_workers`` is the number of workers the call reaches (all of them, or those
    left by ``run_rank_0_only_axes``); a mismatch raises :class:`DispatchLengthError`.
    """
    for label, value in [*((f"argument {i}", v) for i, v in enumerate(args)), *kwargs.items()]:
        try:
            length = len(value)
        except TypeError:
            raise DispatchLengthError(
                f"{label} must be a list with one entry per called worker ({num_workers}), "
                f"got {type(value).__name__}"
            ) from None
        if length != num_workers:
            raise DispatchLengthError(
                f"{label} has {length} entries; give one per called worker ({num_workers})"
            )


def _check_no_kwarg_clash(common_kwargs: Mapping[str, Any], kwargs: Mapping[str, Any]) -> None:
    clash = sorted(set(common_kwargs) & set(kwargs))
    if clash:
        raise ValueError(
            f"keyword arguments {clash} are given both per worker and in common_kwargs; "
            "give each in one place"
        )


# =========================================================================================
# Result selection
# =========================================================================================


def _select_results(
    results: Sequence[Any],
    called_workers: Sequence[int] | None,
    return_from_workers: Sequence[int] | None,
    worker_to_tied_group_index: Mapping[int, int],
) -> list[Any]:
    """The results a caller gets back, in order.

    ``results[i]`` came from worker ``called_workers[i]``. Only workers in
    ``return_from_workers`` (all called ones when None) are kept, in that list's order,
    and of those only the first of each tied group. Without ``called_workers`` the
    worker of each result is unknown: ``return_from_workers`` then selects positions,
    and no tied-group filtering happens.
    """
    if called_workers is None:
        if return_from_workers is None:
            return list(results)
        return [results[i] for i in return_from_workers if 0 <= i < len(results)]
    if len(called_workers) != len(results):
        raise ValueError(
            f"{len(results)} futures but {len(called_workers)} called workers; the two "
            "lists must line up"
        )
    position = {worker: i for i, worker in enumerate(called_workers)}
    order = (
        list(called_workers)
        if return_from_workers is None
        else [worker for worker in return_from_workers if worker in position]
    )
    seen_groups: set[int] = set()
    selected = []
    for worker in order:
        group = worker_to_tied_group_index.get(worker)
        if group is not None:
            if group in seen_groups:
                continue
            seen_groups.add(group)
        selected.append(results[position[worker]])
    return selected

"""Dispatching calls to a worker group's actors, and collecting what they return.

:class:`MultiWorkerFuture` holds the futures of one dispatch and the workers they came
from; :class:`_WorkerDispatch` is the part of
:class:`~raylens.distributed.worker_groups.RayWorkerGroup` that sends calls: to one
worker, to all with the same data, to all with per-worker data, or sharded over the
named axes of the group's :class:`~raylens.distributed.named_sharding.NamedSharding`.
Who is called with what is decided by :mod:`raylens.distributed.worker_planning`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raylens.distributed._oom_reports import out_of_memory_errors, report_out_of_memory
from raylens.distributed.named_sharding import NamedSharding
from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam
from raylens.distributed.worker_planning import (
    WorkerIndexError,
    _check_multiple_data_lengths,
    _check_no_kwarg_clash,
    _plan_sharded_calls,
    _rank0_only_workers,
    _select_results,
    _slice_sharded,
)

__all__ = ["MultiWorkerFuture"]


@dataclass
class MultiWorkerFuture:
    """The futures of one dispatch, and which workers they came from.

    ``futures[i]`` is the result of the call on worker ``called_workers[i]``.
    ``return_from_workers`` lists the workers whose results the caller wants (None:
    all). Either list may be None when unknown.
    """

    futures: list[Any]
    return_from_workers: list[int] | None = None
    called_workers: list[int] | None = None

    def get_results(
        self, worker_group: object, return_generators_as_proxies: bool = False
    ) -> list[Any]:
        """Wait for every future and return the wanted results, one per tied group.

        Results are those of ``return_from_workers`` (in that order), keeping only the
        first worker of each tied group according to
        ``worker_group.worker_to_tied_group_index`` (read when the group has one: any
        group-like object will do). Every future is waited on,
        including those whose result is dropped, so errors anywhere surface here.

        Futures that are ``ObjectRefGenerator`` objects (a streaming method) are returned
        as they are with ``return_generators_as_proxies``, and selected like any
        result. Without it, the call returns one flat list of every item every called
        worker yielded, worker by worker in call order, as NeMo-RL's streaming mode
        does; no selection applies then.
        """
        seam = getattr(worker_group, "_seam", None) or DEFAULT_RAY_SEAM
        ray = seam.ray()
        if not return_generators_as_proxies and any(
            isinstance(future, ray.ObjectRefGenerator) for future in self.futures
        ):
            flat: list[Any] = []
            for future in self.futures:
                if isinstance(future, ray.ObjectRefGenerator):
                    flat.extend(ray.get(item) for item in future)
                else:
                    flat.append(ray.get(future))
            return flat

        values: list[Any] = [None] * len(self.futures)
        plain: list[int] = []
        for position, future in enumerate(self.futures):
            if isinstance(future, ray.ObjectRefGenerator):
                values[position] = future  # only reached with return_generators_as_proxies
            else:
                plain.append(position)
        if plain:
            waited = [self.futures[position] for position in plain]
            try:
                fetched = ray.get(waited)
            except out_of_memory_errors(ray) as error:  # looked at, then raised unchanged
                called = self.called_workers
                ranks = [called[p] if called and p < len(called) else p for p in plain]
                report_out_of_memory(ray, worker_group, waited, ranks, error)
                raise
            for position, value in zip(plain, fetched):
                values[position] = value
        mapping = getattr(worker_group, "worker_to_tied_group_index", None) or {}
        return _select_results(values, self.called_workers, self.return_from_workers, mapping)


def _check_index(name: str, value: object, count: int, allowed: str) -> None:
    """Raise WorkerIndexError unless ``value`` is an int (not a bool) in ``0..count - 1``.

    ``allowed`` describes the range for the message: "this group has {allowed}".
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise WorkerIndexError(f"{name}={value!r} is out of range; this group has {allowed}")


class _WorkerDispatch:
    """The dispatch methods of a worker group, over its workers and sharding."""

    _seam: RaySeam
    _workers: list[Any]
    _dp_leaders: list[int]
    name_prefix: str
    sharding_annotations: NamedSharding | None

    def get_dp_leader_worker_idx(self, dp_shard_idx: int) -> int:
        """The worker that owns data-parallel shard ``dp_shard_idx``."""
        shards = len(self._dp_leaders)
        _check_index("dp_shard_idx", dp_shard_idx, shards, f"{shards} DP shards (0..{shards - 1})")
        return self._dp_leaders[dp_shard_idx]

    def _check_worker_idx(self, worker_idx: int) -> None:
        workers = len(self._workers)
        _check_index("worker_idx", worker_idx, workers, f"{workers} workers")

    # ---- dispatch -------------------------------------------------------------------

    def run_single_worker_single_data(
        self, method_name: str, worker_idx: int, *args: Any, **kwargs: Any
    ) -> Any:
        """Call ``method_name(*args, **kwargs)`` on worker ``worker_idx``; return its future."""
        self._check_worker_idx(worker_idx)
        return getattr(self._workers[worker_idx], method_name).remote(*args, **kwargs)

    def run_all_workers_single_data(
        self,
        method_name: str,
        *args: Any,
        run_rank_0_only_axes: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name`` with the same arguments on every worker; return the futures.

        With ``run_rank_0_only_axes``, only workers at index 0 of each of those axes are
        called. Arguments are stored in the object store once and shared.
        """
        selected = _rank0_only_workers(
            self.sharding_annotations, len(self._workers), run_rank_0_only_axes
        )
        if len(selected) > 1:
            args, kwargs = _put_once(self._seam, args, kwargs)
        return [getattr(self._workers[i], method_name).remote(*args, **kwargs) for i in selected]

    def run_all_workers_multiple_data(
        self,
        method_name: str,
        *args: Any,
        run_rank_0_only_axes: list[str] | None = None,
        common_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name`` on every worker with that worker's entry of each argument.

        Every positional and keyword argument is a list with one entry per *called*
        worker, in the order the workers are called: every worker by rank, or with
        ``run_rank_0_only_axes`` only those at index 0 of each of those axes (so
        NeMo-RL's one entry per data-parallel shard). A list of another length raises
        :class:`DispatchLengthError` (an ``AssertionError``). ``common_kwargs`` go to
        every called worker, stored once.
        """
        common_kwargs = dict(common_kwargs or {})
        _check_no_kwarg_clash(common_kwargs, kwargs)
        selected = _rank0_only_workers(
            self.sharding_annotations, len(self._workers), run_rank_0_only_axes
        )
        _check_multiple_data_lengths(args, kwargs, len(selected))
        if len(selected) > 1:
            _, common_kwargs = _put_once(self._seam, (), common_kwargs)
        futures = []
        for position, worker_idx in enumerate(selected):
            worker_args = [arg[position] for arg in args]
            worker_kwargs = {key: value[position] for key, value in kwargs.items()}
            futures.append(
                getattr(self._workers[worker_idx], method_name).remote(
                    *worker_args, **worker_kwargs, **common_kwargs
                )
            )
        return futures

    def run_all_workers_sharded_data(
        self,
        method_name: str,
        *args: Any,
        in_sharded_axes: list[str] | None = None,
        replicate_on_axes: list[str] | None = None,
        output_is_replicated: list[str] | None = None,
        make_dummy_calls_to_free_axes: bool = False,
        common_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> MultiWorkerFuture:
        """Call ``method_name`` on the workers, each with its slice of sharded data.

        Positional and keyword arguments are nested lists indexed by the worker's
        coordinate along each axis of ``in_sharded_axes``, in that order. Along
        ``replicate_on_axes`` every index gets the same slice. On the remaining (free)
        axes only index 0 is called, unless ``make_dummy_calls_to_free_axes``, in
        which case the others are called with None for every argument. Results come
        back only from index 0 of free axes and of ``output_is_replicated`` axes.
        ``common_kwargs`` go to every call. A slice that several workers receive is
        stored in the object store once.
        """
        sharding = self.sharding_annotations
        if sharding is None:
            raise ValueError(
                f"worker group {self.name_prefix!r} has no sharding_annotations; sharded "
                "dispatch needs them"
            )
        common_kwargs = dict(common_kwargs or {})
        _check_no_kwarg_clash(common_kwargs, kwargs)
        calls, returned = _plan_sharded_calls(
            sharding,
            in_sharded_axes,
            replicate_on_axes,
            output_is_replicated,
            make_dummy_calls_to_free_axes,
        )
        axes = list(in_sharded_axes or [])
        receivers: dict[tuple[int, ...], int] = {}
        for call in calls:
            if call.data_coords is not None:
                receivers[call.data_coords] = receivers.get(call.data_coords, 0) + 1
        slices: dict[tuple[int, ...], tuple[tuple[Any, ...], dict[str, Any]]] = {}
        for coords, count in receivers.items():
            sliced_args = tuple(
                _slice_sharded(arg, axes, coords, sharding, f"argument {i}")
                for i, arg in enumerate(args)
            )
            sliced_kwargs = {
                key: _slice_sharded(value, axes, coords, sharding, f"keyword argument {key!r}")
                for key, value in kwargs.items()
            }
            if count > 1:
                sliced_args, sliced_kwargs = _put_once(self._seam, sliced_args, sliced_kwargs)
            slices[coords] = (sliced_args, sliced_kwargs)
        if len(calls) > 1:
            _, common_kwargs = _put_once(self._seam, (), common_kwargs)
        futures = []
        for call in calls:
            if call.data_coords is None:
                call_args: tuple[Any, ...] = (None,) * len(args)
                call_kwargs: dict[str, Any] = dict.fromkeys(kwargs)
            else:
                call_args, call_kwargs = slices[call.data_coords]
            futures.append(
                getattr(self._workers[call.worker_idx], method_name).remote(
                    *call_args, **call_kwargs, **common_kwargs
                )
            )
        return MultiWorkerFuture(
            futures=futures,
            return_from_workers=returned,
            called_workers=[call.worker_idx for call in calls],
        )

    def get_all_worker_results(
        self, future_bundle: MultiWorkerFuture, return_generators_as_proxies: bool = False
    ) -> list[Any]:
        """The results of ``future_bundle``, selected as :meth:`MultiWorkerFuture.get_results`."""
        return future_bundle.get_results(self, return_generators_as_proxies)


def _put_once(
    seam: RaySeam, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Store every argument that is not already a Ray reference in the object store once.

    Top-level references are resolved by Ray before the method runs, so workers see
    the values while the data is serialized a single time.
    """
    if not args and not kwargs:
        return (), {}
    ray = seam.ray()

    def put(value: Any) -> Any:
        if isinstance(value, (ray.ObjectRef, ray.ObjectRefGenerator)):
            return value
        return ray.put(value)

    return tuple(put(arg) for arg in args), {key: put(value) for key, value in kwargs.items()}

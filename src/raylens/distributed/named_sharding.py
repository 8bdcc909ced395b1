"""Named axes over a grid of worker ranks.

A :class:`NamedSharding` says where each worker rank sits in a parallel layout, for
example ``[[0, 1], [2, 3]]`` with names ``["dp", "tp"]``: two data-parallel replicas of
two tensor-parallel ranks each. Worker groups use it to decide which workers receive
which slice of the data.

It behaves as NeMo-RL's class of the same name, so code ported from there keeps
working: the layout is a NumPy integer array that may hold any set of unique ranks
(a sub-sharding returned by :meth:`NamedSharding.get_ranks` keeps the global ranks and
can be rebuilt from its layout), and indexing follows NumPy's rules.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import SupportsIndex

import numpy as np

__all__ = ["REPLICATED_AXES", "NamedSharding", "ShardingIndexError"]

#: Axes along which every rank holds the same copy of the data, so only index 0 of
#: each needs to act on it (see :meth:`NamedSharding.is_axis_zero`).
REPLICATED_AXES = ("tensor_parallel", "context_parallel", "pipeline_parallel")


class ShardingIndexError(IndexError, ValueError):
    """An index along a named axis that is outside it.

    An ``IndexError``, as NumPy indexing raises, and a ``ValueError`` like every other
    mistake in a sharding call.
    """


def _as_integer_array(layout: object) -> np.ndarray:
    """``layout`` as a fresh integer array; ValueError for ragged or non-integer input."""
    try:
        array = np.array(layout)
    except ValueError as error:
        raise ValueError(
            f"the layout must be rectangular (every row the same length): {error}"
        ) from None
    if array.dtype == object:
        # Integer-like objects (anything with __index__) are accepted one by one; a
        # ragged nesting also ends up here and is reported as such.
        flat = []
        for value in array.reshape(-1):
            if isinstance(value, (list, tuple)):
                raise ValueError(
                    "the layout is ragged: it must be rectangular (every row the same length)"
                )
            try:
                flat.append(operator.index(value))
            except TypeError:
                raise ValueError(
                    f"Layout must contain only integer rank IDs; got {value!r}"
                ) from None
        return np.array(flat, dtype=np.int64).reshape(array.shape)
    if np.issubdtype(array.dtype, np.integer):
        return array
    if np.issubdtype(array.dtype, np.floating):
        whole = np.isfinite(array) & (np.mod(array, 1) == 0)
        if bool(np.all(whole)):
            return array.astype(np.int64)
        bad = array[~whole].reshape(-1)[0]
        raise ValueError(f"Layout must contain only integer rank IDs; got {bad!r}")
    sample = array.reshape(-1)[0].item() if array.size else None
    raise ValueError(
        f"Layout must contain only integer rank IDs; got {sample!r} ({array.dtype} entries)"
    )


def _checked_names(names: Sequence[str]) -> list[str]:
    names = list(names)
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"every axis name must be a string, got {name!r}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(
            f"axis names must be unique; {', '.join(map(repr, repeated))} appears "
            f"more than once in {names}"
        )
    return names


class NamedSharding:
    """A rectangular grid of unique integer worker ranks whose axes have names.

    ``layout`` is anything NumPy turns into a rectangular integer array (nested lists,
    an array); whole-number floats are accepted and stored as integers. ``names``
    gives one name per dimension, outermost first. Construction raises ValueError for
    duplicate ranks, non-integer entries, ragged nesting, repeated names, or a name
    count that differs from the number of dimensions.

    Instances are immutable: :attr:`layout` and :attr:`names` return copies. Two
    shardings are equal when their names and layouts are.
    """

    #: See the module constant :data:`REPLICATED_AXES`.
    REPLICATED_AXES = REPLICATED_AXES

    def __init__(self, layout: object, names: Sequence[str]) -> None:
        array = _as_integer_array(layout)
        names = _checked_names(names)
        if array.ndim != len(names):
            raise ValueError(
                f"Number of dimensions in layout ({array.ndim}) must match number of names "
                f"({len(names)}): the layout has shape {list(array.shape)}, the names are "
                f"{names}; give exactly one name per dimension"
            )
        ranks, counts = np.unique(array, return_counts=True)
        duplicates = ranks[counts > 1]
        if duplicates.size:
            raise ValueError(
                f"Duplicate ranks found in layout: {duplicates.tolist()}; each rank may "
                "appear only once"
            )
        array.setflags(write=False)
        self._layout = array
        self._names = names
        self._axis_of = {name: axis for axis, name in enumerate(names)}
        self._rank_to_coords: dict[int, tuple[int, ...]] = {
            int(array[coords]): tuple(int(c) for c in coords) for coords in np.ndindex(array.shape)
        }

    # ---- description ----------------------------------------------------------------

    @property
    def shape(self) -> dict[str, int]:
        """Axis name to axis length, in axis order."""
        return {name: int(extent) for name, extent in zip(self._names, self._layout.shape)}

    @property
    def names(self) -> list[str]:
        """Axis names, outermost first (a copy)."""
        return list(self._names)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self._names)

    @property
    def size(self) -> int:
        """Number of ranks in the layout."""
        return int(self._layout.size)

    @property
    def layout(self) -> np.ndarray:
        """The rank grid as an integer array (a copy the caller may change)."""
        return self._layout.copy()

    def get_axis_index(self, name: str) -> int:
        """Position of axis ``name`` among the dimensions; ValueError if unknown."""
        try:
            return self._axis_of[name]
        except (KeyError, TypeError):
            raise ValueError(self._unknown_axis_message(name)) from None

    def get_axis_size(self, name: str) -> int:
        """Length of axis ``name``; ValueError if unknown."""
        return int(self._layout.shape[self.get_axis_index(name)])

    @staticmethod
    def is_axis_zero(coords: Mapping[str, int], axes: Iterable[str]) -> bool:
        """True when ``coords`` is at index 0 of every axis in ``axes``.

        An axis missing from ``coords`` counts as index 0, so a worker of a sharding
        without, say, a context-parallel axis is at its only index there.
        """
        return all(coords.get(axis, 0) == 0 for axis in axes)

    # ---- lookups --------------------------------------------------------------------

    def get_worker_coords(self, worker_id: int) -> dict[str, int]:
        """Where ``worker_id`` sits: ``{axis name: index along that axis}``."""
        coords = None
        if not isinstance(worker_id, bool):
            try:
                coords = self._rank_to_coords.get(operator.index(worker_id))
            except TypeError:
                coords = None
        if coords is None:
            raise ValueError(
                f"Worker ID {worker_id!r} not found in sharding layout. It holds "
                f"{self.size} ranks{self._rank_range()}"
            )
        return dict(zip(self._names, coords))

    def get_ranks_by_coord(self, **coords: int) -> list[int]:
        """Every rank whose coordinates match ``coords``, in ascending order.

        Axes left out match any index, so ``get_ranks_by_coord(dp=1)`` lists the whole
        replica ``dp=1``. An index outside its axis matches nothing (an empty list).
        """
        index: list[slice | int] = [slice(None)] * self.ndim
        for name, position in coords.items():
            axis = self.get_axis_index(name)
            extent = self._layout.shape[axis]
            value = self._integer_index(name, position, extent)
            if not 0 <= value < extent:
                return []
            index[axis] = value
        return sorted(int(rank) for rank in np.asarray(self._layout[tuple(index)]).reshape(-1))

    def get_ranks(self, **indices: int) -> NamedSharding | int:
        """Index the grid by axis name, as NumPy indexes the layout.

        With every axis given, the single rank there (an int). With some axes given,
        the sub-grid that remains, as a NamedSharding over the remaining axes holding
        the same global ranks. With none given, this sharding itself. A negative index
        counts from the end of its axis; one outside the axis raises
        :class:`ShardingIndexError` (an ``IndexError``).
        """
        if not indices:
            return self
        index: list[slice | int] = [slice(None)] * self.ndim
        for name, position in indices.items():
            axis = self.get_axis_index(name)
            extent = int(self._layout.shape[axis])
            value = self._integer_index(name, position, extent)
            if not -extent <= value < extent:
                # Worded as NeMo-RL's, whose callers match the start of the message.
                raise ShardingIndexError(
                    f"Index {value} is out of bounds for axis '{name}' with size {extent}: "
                    f"{name}={value} must be in 0..{extent - 1} (or -{extent}..-1 from "
                    "the end)"
                )
            index[axis] = value
        selected = self._layout[tuple(index)]
        remaining = [name for name in self._names if name not in indices]
        if not remaining:
            return int(selected)
        return NamedSharding(selected, remaining)

    @staticmethod
    def _integer_index(name: str, position: object, extent: int) -> int:
        if not isinstance(position, bool) and isinstance(position, SupportsIndex):
            try:
                return operator.index(position)
            except TypeError:
                pass
        raise ShardingIndexError(
            f"index {name}={position!r} is not an integer: axis {name!r} takes an integer "
            f"0..{extent - 1}"
        )

    def _rank_range(self) -> str:
        if not self._rank_to_coords:
            return ""
        return f" between {min(self._rank_to_coords)} and {max(self._rank_to_coords)}"

    def _unknown_axis_message(self, name: object) -> str:
        return f"Invalid axis name: {name!r}. Valid names are: {self._names}"

    # ---- value semantics ------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NamedSharding):
            return NotImplemented
        return self._names == other._names and bool(np.array_equal(self._layout, other._layout))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"NamedSharding(shape={tuple(int(n) for n in self._layout.shape)}, "
            f"names={self._names}, layout={self._layout})"
        )

"""Named axes over a grid of worker ranks.

A :class:`NamedSharding` says where each worker rank sits in a parallel layout, for
example ``[[0, 1], [2, 3]]`` with names ``["dp", "tp"]``: two data-parallel replicas of
two tensor-parallel ranks each. Worker groups use it to decide which workers receive
which slice of the data.

The layout is kept as nested Python lists, so this module needs nothing beyond the
standard library. Anything that offers ``tolist()`` (a NumPy array, say) is accepted
as input.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

__all__ = ["NamedSharding"]

_Coords = tuple[int, ...]


def _is_nested(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _as_rank(value: Any) -> int:
    """``value`` as a plain int, or ValueError when it is not an integer."""
    try:
        if isinstance(value, bool):
            raise TypeError("a bool is not a rank")
        return operator.index(value)
    except TypeError:
        raise ValueError(f"every rank in the layout must be an integer, got {value!r}") from None


def _shape_of(layout: Any) -> tuple[int, ...]:
    """The dimensions of a rectangular nested list; ValueError for ragged ones."""
    shape: list[int] = []
    level = layout
    while _is_nested(level):
        shape.append(len(level))
        if not level:
            break
        level = level[0]
    _check_rectangular(layout, tuple(shape), ())
    return tuple(shape)


def _check_rectangular(node: Any, shape: tuple[int, ...], where: _Coords) -> None:
    depth = len(where)
    if depth == len(shape):
        if _is_nested(node):
            raise ValueError(
                f"the layout is ragged: element at {list(where)} is a sequence, "
                f"expected a rank (the layout must be rectangular with shape {list(shape)})"
            )
        return
    if not _is_nested(node) or len(node) != shape[depth]:
        found = f"length {len(node)}" if _is_nested(node) else f"the value {node!r}"
        raise ValueError(
            f"the layout is ragged: element at {list(where)} has {found}, expected a "
            f"sequence of length {shape[depth]} (the layout must be rectangular "
            f"with shape {list(shape)})"
        )
    for position, child in enumerate(node):
        _check_rectangular(child, shape, (*where, position))


def _map_leaves(node: Any, fn: Any) -> Any:
    if _is_nested(node):
        return [_map_leaves(child, fn) for child in node]
    return fn(node)


def _at(layout: Any, coords: _Coords) -> Any:
    for index in coords:
        layout = layout[index]
    return layout


def _deep_copy(layout: Any) -> Any:
    return _map_leaves(layout, lambda rank: rank)


class NamedSharding:
    """A rectangular grid of worker ranks whose axes have names.

    ``layout`` is a nested sequence (or anything with ``tolist()``) holding every rank
    ``0..n-1`` exactly once; ``names`` gives one name per dimension, outermost first.
    Construction raises ValueError for duplicate or missing ranks, non-integer entries,
    ragged nesting, or a name count that differs from the number of dimensions.

    Instances are immutable: :attr:`layout` and :attr:`names` return copies.
    """

    def __init__(self, layout: Any, names: Sequence[str]) -> None:
        if hasattr(layout, "tolist") and not _is_nested(layout):
            layout = layout.tolist()
        if not _is_nested(layout):
            raise ValueError(
                f"layout must be a (nested) sequence of ranks such as [[0, 1], [2, 3]], "
                f"got {layout!r}"
            )
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
        shape = _shape_of(layout)
        if len(shape) != len(names):
            dims = f"{len(shape)} dimension{'s' if len(shape) != 1 else ''}"
            given = f"{len(names)} name{'s' if len(names) != 1 else ''}"
            raise ValueError(
                f"the layout has {dims} (shape {list(shape)}) but {given} were given "
                f"({names}); give exactly one name per dimension"
            )
        size = 1
        for extent in shape:
            size *= extent
        if size == 0:
            raise ValueError(f"the layout is empty (shape {list(shape)}): it holds no ranks")
        ranks_layout = _map_leaves(layout, _as_rank)
        rank_to_coords: dict[int, _Coords] = {}
        duplicates: set[int] = set()
        for coords in itertools.product(*(range(extent) for extent in shape)):
            rank = _at(ranks_layout, coords)
            if rank in rank_to_coords:
                duplicates.add(rank)
            rank_to_coords[rank] = coords
        if duplicates:
            raise ValueError(
                f"the layout holds duplicate ranks {sorted(duplicates)}; each rank "
                f"0..{size - 1} must appear exactly once"
            )
        expected = set(range(size))
        if set(rank_to_coords) != expected:
            missing = sorted(expected - set(rank_to_coords))
            unexpected = sorted(set(rank_to_coords) - expected)
            raise ValueError(
                f"a layout of {size} entries must hold the ranks 0..{size - 1} exactly "
                f"once: missing {missing}, unexpected {unexpected}"
            )
        self._layout = ranks_layout
        self._names = names
        self._shape = shape
        self._size = size
        self._rank_to_coords = rank_to_coords

    # ---- description ----------------------------------------------------------------

    @property
    def shape(self) -> dict[str, int]:
        """Axis name to axis length, in axis order."""
        return dict(zip(self._names, self._shape))

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
        return self._size

    @property
    def layout(self) -> Any:
        """The rank grid as nested lists of ints (a copy the caller may change)."""
        return _deep_copy(self._layout)

    def get_axis_index(self, name: str) -> int:
        """Position of axis ``name`` among the dimensions; ValueError if unknown."""
        try:
            return self._names.index(name)
        except ValueError:
            raise ValueError(self._unknown_axis_message(name)) from None

    def get_axis_size(self, name: str) -> int:
        """Length of axis ``name``; ValueError if unknown."""
        return self._shape[self.get_axis_index(name)]

    # ---- lookups --------------------------------------------------------------------

    def get_worker_coords(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits: ``{axis name: index along that axis}``."""
        try:
            coords = None if isinstance(rank, bool) else self._rank_to_coords.get(rank.__index__())
        except AttributeError:
            coords = None
        if coords is None:
            raise ValueError(f"rank {rank!r} is not in this layout; ranks are 0..{self._size - 1}")
        return dict(zip(self._names, coords))

    def get_ranks_by_coord(self, **coords: int) -> list[int]:
        """Every rank whose coordinates match ``coords``, in ascending order.

        Axes left out match any index, so ``get_ranks_by_coord(dp=1)`` lists the whole
        replica ``dp=1``.
        """
        fixed = self._checked_indices(coords)
        return sorted(
            rank
            for rank, position in self._rank_to_coords.items()
            if all(position[axis] == index for axis, index in fixed.items())
        )

    def get_ranks(self, **indices: int) -> NamedSharding | int:
        """Index the grid by axis name.

        With every axis given, the single rank there. With some axes given, the
        sub-grid that remains, as a NamedSharding over the remaining axes whose
        entries are still the global ranks (so it is not renumbered). With none
        given, this sharding itself.
        """
        fixed = self._checked_indices(indices)
        if not fixed:
            return self
        if len(fixed) == self.ndim:
            return _at(self._layout, tuple(fixed[axis] for axis in range(self.ndim)))
        remaining = [axis for axis in range(self.ndim) if axis not in fixed]
        sub = self._select(self._layout, 0, fixed)
        sharding = NamedSharding.__new__(NamedSharding)
        sharding._layout = sub
        sharding._names = [self._names[axis] for axis in remaining]
        sharding._shape = tuple(self._shape[axis] for axis in remaining)
        sharding._size = 1
        for extent in sharding._shape:
            sharding._size *= extent
        sharding._rank_to_coords = {}
        for coords in itertools.product(*(range(extent) for extent in sharding._shape)):
            sharding._rank_to_coords[_at(sub, coords)] = coords
        return sharding

    def _select(self, node: Any, depth: int, fixed: dict[int, int]) -> Any:
        if depth == self.ndim:
            return node
        if depth in fixed:
            return self._select(node[fixed[depth]], depth + 1, fixed)
        return [self._select(child, depth + 1, fixed) for child in node]

    def _checked_indices(self, indices: dict[str, Any]) -> dict[int, int]:
        fixed: dict[int, int] = {}
        for name, index in indices.items():
            axis = self.get_axis_index(name)
            extent = self._shape[axis]
            try:
                position = _as_rank(index)
            except ValueError:
                position = None
            if position is None or not 0 <= position < extent:
                problem = "is out of range" if position is not None else "is not an integer"
                raise ValueError(
                    f"{name}={index!r} {problem}: axis {name!r} takes an integer 0..{extent - 1}"
                )
            fixed[axis] = position
        return fixed

    def _unknown_axis_message(self, name: object) -> str:
        known = ", ".join(repr(known) for known in self._names)
        return f"unknown axis {name!r}; this sharding's axes are {known}"

    # ---- value semantics ------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NamedSharding):
            return NotImplemented
        return self._names == other._names and self._layout == other._layout

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"NamedSharding(layout={self._layout!r}, names={self._names!r})"

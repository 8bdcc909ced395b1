"""NamedSharding agrees with plain NumPy indexing of the same rank grid.

The oracle is the layout itself as an ``np.ndarray``: every lookup a sharding answers
by axis name is computed here by positional NumPy indexing and compared.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raylens.distributed.named_sharding import NamedSharding, ShardingIndexError

AXIS_NAMES = ("dp", "tp", "pp", "cp", "ep")


@st.composite
def grids(draw: st.DrawFn, min_extent: int = 1) -> tuple[np.ndarray, list[str]]:
    """A rank grid of up to four axes with unique, not necessarily contiguous ranks."""
    shape = draw(st.lists(st.integers(min_extent, 3), min_size=1, max_size=4))
    size = int(np.prod(shape))
    ranks = draw(
        st.one_of(
            st.permutations(range(size)),
            st.lists(st.integers(-100, 100), min_size=size, max_size=size, unique=True),
        )
    )
    names = draw(st.permutations(AXIS_NAMES))[: len(shape)]
    return np.array(ranks, dtype=np.int64).reshape(shape), list(names)


@st.composite
def grids_with_indices(
    draw: st.DrawFn, allow_negative: bool = True
) -> tuple[np.ndarray, list[str], dict[str, int]]:
    """A grid and a valid index along some (possibly all, possibly none) of its axes."""
    oracle, names = draw(grids())
    chosen = draw(st.lists(st.sampled_from(range(len(names))), unique=True))
    indices = {}
    for axis in chosen:
        extent = oracle.shape[axis]
        low = -extent if allow_negative else 0
        indices[names[axis]] = draw(st.integers(low, extent - 1))
    return oracle, names, indices


def _numpy_index(names: list[str], indices: dict[str, int]) -> tuple[Any, ...]:
    return tuple(indices.get(name, slice(None)) for name in names)


@given(grids())
def test_description_matches_the_array(grid: tuple[np.ndarray, list[str]]) -> None:
    oracle, names = grid
    sharding = NamedSharding(oracle.tolist(), names)
    assert sharding.names == names
    assert sharding.ndim == oracle.ndim
    assert sharding.size == oracle.size
    assert sharding.shape == dict(zip(names, oracle.shape))
    assert list(sharding.shape) == names
    for axis, name in enumerate(names):
        assert sharding.get_axis_index(name) == axis
        assert sharding.get_axis_size(name) == oracle.shape[axis]
    assert np.array_equal(sharding.layout, oracle)


@given(grids())
def test_every_rank_is_found_where_numpy_puts_it(grid: tuple[np.ndarray, list[str]]) -> None:
    oracle, names = grid
    sharding = NamedSharding(oracle, names)
    for coords in np.ndindex(oracle.shape):
        rank = int(oracle[coords])
        assert sharding.get_worker_coords(rank) == dict(zip(names, coords))
        assert sharding.get_ranks(**dict(zip(names, coords))) == rank


@given(grids(), st.integers(-2000, 2000))
def test_a_rank_outside_the_grid_has_no_coordinates(
    grid: tuple[np.ndarray, list[str]], rank: int
) -> None:
    oracle, names = grid
    sharding = NamedSharding(oracle, names)
    if rank in oracle:
        assert oracle[tuple(sharding.get_worker_coords(rank).values())] == rank
    else:
        with pytest.raises(ValueError, match=f"Worker ID {rank} not found"):
            sharding.get_worker_coords(rank)


@given(grids_with_indices())
def test_get_ranks_indexes_as_numpy_does(
    case: tuple[np.ndarray, list[str], dict[str, int]],
) -> None:
    oracle, names, indices = case
    sharding = NamedSharding(oracle, names)
    result = sharding.get_ranks(**indices)
    expected = oracle[_numpy_index(names, indices)]
    if len(indices) == len(names):
        assert isinstance(result, int) and not isinstance(result, bool)
        assert result == int(expected)
        return
    assert isinstance(result, NamedSharding)
    remaining = [name for name in names if name not in indices]
    assert result.names == remaining
    assert np.array_equal(result.layout, expected)
    # A sub-sharding keeps the global ranks and rebuilds into an equal sharding.
    assert result == NamedSharding(result.layout, result.names)
    assert result == NamedSharding(expected.tolist(), remaining)
    for rank in expected.reshape(-1).tolist():
        full = {**indices, **result.get_worker_coords(rank)}
        assert sharding.get_ranks(**full) == rank


@given(grids_with_indices(), st.data())
def test_indexing_in_two_steps_equals_indexing_at_once(
    case: tuple[np.ndarray, list[str], dict[str, int]], data: st.DataObject
) -> None:
    oracle, names, indices = case
    sharding = NamedSharding(oracle, names)
    names_given = list(indices)
    split = data.draw(st.integers(0, len(names_given)))
    first = {name: indices[name] for name in names_given[:split]}
    second = {name: indices[name] for name in names_given[split:]}
    step = sharding.get_ranks(**first)
    assert isinstance(step, NamedSharding) or not second
    if isinstance(step, NamedSharding):
        assert step.get_ranks(**second) == sharding.get_ranks(**indices)


@given(grids_with_indices(allow_negative=False))
def test_get_ranks_by_coord_lists_the_selected_ranks_in_order(
    case: tuple[np.ndarray, list[str], dict[str, int]],
) -> None:
    oracle, names, indices = case
    sharding = NamedSharding(oracle, names)
    expected = sorted(np.asarray(oracle[_numpy_index(names, indices)]).reshape(-1).tolist())
    assert sharding.get_ranks_by_coord(**indices) == expected


@given(grids(), st.data())
def test_an_index_outside_its_axis(grid: tuple[np.ndarray, list[str]], data: st.DataObject) -> None:
    """get_ranks raises IndexError for it; get_ranks_by_coord matches nothing."""
    oracle, names = grid
    sharding = NamedSharding(oracle, names)
    axis = data.draw(st.sampled_from(range(len(names))))
    extent = oracle.shape[axis]
    outside = data.draw(
        st.one_of(st.integers(extent, extent + 5), st.integers(-extent - 5, -extent - 1))
    )
    with pytest.raises(ShardingIndexError) as raised:
        sharding.get_ranks(**{names[axis]: outside})
    assert isinstance(raised.value, IndexError)
    assert f"{names[axis]}={outside}" in str(raised.value)
    assert sharding.get_ranks_by_coord(**{names[axis]: outside}) == []
    if outside < 0:
        # Negative indices never match by coordinate, even those get_ranks accepts.
        assert sharding.get_ranks_by_coord(**{names[axis]: -1}) == []


@given(grids(), st.data())
def test_equality_follows_names_and_layout(
    grid: tuple[np.ndarray, list[str]], data: st.DataObject
) -> None:
    oracle, names = grid
    sharding = NamedSharding(oracle, names)
    assert sharding == NamedSharding(oracle.copy(), list(names))
    copy = sharding.layout
    copy.reshape(-1)[0] += 10_000
    assert sharding == NamedSharding(oracle, names), "changing a copy of the layout changed it"
    assert sharding != NamedSharding(copy, names)
    if len(names) > 1:
        swapped = [names[1], names[0], *names[2:]]
        assert sharding != NamedSharding(oracle, swapped)
    if oracle.ndim > 1 and oracle.size > 1:
        flat_names = [data.draw(st.sampled_from(AXIS_NAMES))]
        assert sharding != NamedSharding(oracle.reshape(-1), flat_names)


@given(grids(min_extent=0), st.data())
def test_empty_axes_select_nothing_as_numpy_does(
    grid: tuple[np.ndarray, list[str]], data: st.DataObject
) -> None:
    oracle, names = grid
    sharding = NamedSharding(oracle, names)
    assert sharding.size == oracle.size
    assert sharding.shape == dict(zip(names, oracle.shape))
    assert sharding.get_ranks_by_coord() == sorted(oracle.reshape(-1).tolist())
    indexable = [axis for axis, extent in enumerate(oracle.shape) if extent > 0]
    if indexable and len(indexable) < len(names):
        axis = data.draw(st.sampled_from(indexable))
        position = data.draw(st.integers(0, oracle.shape[axis] - 1))
        sub = sharding.get_ranks(**{names[axis]: position})
        assert isinstance(sub, NamedSharding)
        assert np.array_equal(sub.layout, np.take(oracle, position, axis=axis))
        assert sub == NamedSharding(sub.layout, sub.names)

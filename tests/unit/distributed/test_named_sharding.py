"""NamedSharding: a rank layout over named axes, validated up front and queried by name.

It behaves as NeMo-RL's ``NamedSharding``: the layout is a NumPy integer array that may
hold any unique ranks, sub-shardings keep their global ranks and can be rebuilt, and the
errors carry the phrases NeMo-RL's own tests look for.
"""

from __future__ import annotations

import numpy as np
import pytest

from raylens.distributed.named_sharding import REPLICATED_AXES, NamedSharding

# dp x tp: rank = dp * 2 + tp
GRID = [[0, 1], [2, 3], [4, 5]]
# dp x pp x tp = 1 x 2 x 4
CUBE = [[[0, 1, 2, 3], [4, 5, 6, 7]]]


@pytest.fixture
def grid() -> NamedSharding:
    return NamedSharding(GRID, ["dp", "tp"])


@pytest.fixture
def cube() -> NamedSharding:
    return NamedSharding(CUBE, ["dp", "pp", "tp"])


def test_shape_names_ndim_size(grid: NamedSharding) -> None:
    assert grid.shape == {"dp": 3, "tp": 2}
    assert list(grid.shape) == ["dp", "tp"]
    assert grid.names == ["dp", "tp"]
    assert grid.ndim == 2
    assert grid.size == 6


def test_layout_is_an_integer_array(grid: NamedSharding) -> None:
    layout = grid.layout
    assert isinstance(layout, np.ndarray)
    assert np.issubdtype(layout.dtype, np.integer)
    assert layout.tolist() == GRID


def test_layout_is_a_copy(grid: NamedSharding) -> None:
    layout = grid.layout
    layout[0][0] = 99
    assert grid.layout.tolist() == GRID


def test_names_is_a_copy(grid: NamedSharding) -> None:
    grid.names.append("pp")
    assert grid.names == ["dp", "tp"]


def test_accepts_tuples_arrays_and_copies_input() -> None:
    source = [[0, 1], [2, 3]]
    sharding = NamedSharding(source, ("a", "b"))
    source[0][0] = 3
    assert sharding.layout.tolist() == [[0, 1], [2, 3]]
    array = np.arange(4).reshape(2, 2)
    from_array = NamedSharding(array, ["a", "b"])
    array[0, 0] = 7
    assert from_array.layout.tolist() == [[0, 1], [2, 3]]


def test_axis_index_and_size(grid: NamedSharding) -> None:
    assert grid.get_axis_index("dp") == 0
    assert grid.get_axis_index("tp") == 1
    assert grid.get_axis_size("dp") == 3
    assert grid.get_axis_size("tp") == 2


@pytest.mark.parametrize("method", ["get_axis_index", "get_axis_size"])
def test_unknown_axis_is_named_in_error(grid: NamedSharding, method: str) -> None:
    with pytest.raises(ValueError, match=r"Invalid axis name: 'pp'.*'dp', 'tp'"):
        getattr(grid, method)("pp")


def test_worker_coords(grid: NamedSharding) -> None:
    assert grid.get_worker_coords(0) == {"dp": 0, "tp": 0}
    assert grid.get_worker_coords(3) == {"dp": 1, "tp": 1}
    assert grid.get_worker_coords(4) == {"dp": 2, "tp": 0}
    assert all(type(v) is int for v in grid.get_worker_coords(5).values())


def test_worker_coords_of_permuted_layout() -> None:
    sharding = NamedSharding([[3, 1], [0, 2]], ["a", "b"])
    assert sharding.get_worker_coords(0) == {"a": 1, "b": 0}
    assert sharding.get_worker_coords(3) == {"a": 0, "b": 0}


@pytest.mark.parametrize("rank", [-1, 6, 100])
def test_worker_coords_of_absent_rank(grid: NamedSharding, rank: int) -> None:
    with pytest.raises(ValueError, match=rf"Worker ID {rank} not found in sharding layout\."):
        grid.get_worker_coords(rank)


def test_ranks_by_coord_full_and_partial(grid: NamedSharding) -> None:
    assert grid.get_ranks_by_coord(dp=1, tp=0) == [2]
    assert grid.get_ranks_by_coord(dp=1) == [2, 3]
    assert grid.get_ranks_by_coord(tp=1) == [1, 3, 5]
    assert grid.get_ranks_by_coord() == [0, 1, 2, 3, 4, 5]
    assert all(type(rank) is int for rank in grid.get_ranks_by_coord(dp=1))


def test_ranks_by_coord_are_sorted() -> None:
    sharding = NamedSharding([[5, 1], [4, 0], [2, 3]], ["a", "b"])
    assert sharding.get_ranks_by_coord(b=0) == [2, 4, 5]


def test_ranks_by_coord_out_of_range_is_empty(grid: NamedSharding) -> None:
    assert grid.get_ranks_by_coord(dp=3) == []
    assert grid.get_ranks_by_coord(tp=2) == []
    assert grid.get_ranks_by_coord(dp=-1) == []


def test_ranks_by_coord_rejects_unknown_axis(grid: NamedSharding) -> None:
    with pytest.raises(ValueError, match="Invalid axis name: 'pp'"):
        grid.get_ranks_by_coord(pp=0)


def test_get_ranks_fully_indexed_is_an_int(grid: NamedSharding) -> None:
    assert grid.get_ranks(dp=2, tp=1) == 5
    assert type(grid.get_ranks(dp=2, tp=1)) is int


def test_get_ranks_partial_is_a_named_sub_sharding(grid: NamedSharding) -> None:
    row = grid.get_ranks(dp=1)
    assert isinstance(row, NamedSharding)
    assert row.names == ["tp"]
    assert row.layout.tolist() == [2, 3]
    column = grid.get_ranks(tp=1)
    assert isinstance(column, NamedSharding)
    assert column.names == ["dp"]
    assert column.layout.tolist() == [1, 3, 5]


def test_sub_sharding_keeps_global_ranks_and_can_be_rebuilt(cube: NamedSharding) -> None:
    sub = cube.get_ranks(dp=0, pp=1)
    assert isinstance(sub, NamedSharding)
    assert sub.layout.tolist() == [4, 5, 6, 7]
    rebuilt = NamedSharding([4, 5, 6, 7], ["tp"])
    assert rebuilt == sub
    assert rebuilt.get_worker_coords(6) == {"tp": 2}
    assert rebuilt.get_ranks(tp=1) == 5
    assert rebuilt.get_ranks_by_coord(tp=3) == [7]


def test_nested_sub_sharding(cube: NamedSharding) -> None:
    plane = cube.get_ranks(dp=0)
    assert isinstance(plane, NamedSharding)
    assert plane.names == ["pp", "tp"]
    assert plane.get_ranks(pp=1, tp=1) == 5
    middle = cube.get_ranks(tp=1)
    assert isinstance(middle, NamedSharding)
    assert middle.layout.tolist() == [[1, 5]]


def test_get_ranks_without_index_is_the_whole_sharding(grid: NamedSharding) -> None:
    assert grid.get_ranks() == grid


def test_get_ranks_out_of_range_is_an_index_error(cube: NamedSharding) -> None:
    with pytest.raises(IndexError, match=r"size 2.*pp=2"):
        cube.get_ranks(pp=2)
    with pytest.raises(ValueError):  # raylens' own callers catch ValueError
        cube.get_ranks(pp=2)


def test_get_ranks_out_of_range_starts_as_nemo_rl_words_it(cube: NamedSharding) -> None:
    with pytest.raises(IndexError) as raised:
        cube.get_ranks(pp=2)
    assert str(raised.value).startswith("Index 2 is out of bounds for axis 'pp'")
    with pytest.raises(IndexError) as raised:
        cube.get_ranks(dp=0, tp=np.int64(-5))
    assert str(raised.value).startswith("Index -5 is out of bounds for axis 'tp'")


def test_get_ranks_counts_negative_indices_from_the_end(grid: NamedSharding) -> None:
    assert grid.get_ranks(dp=-1, tp=0) == 4
    with pytest.raises(IndexError):
        grid.get_ranks(dp=-4)


def test_get_ranks_rejects_unknown_axis_and_non_integer_index(grid: NamedSharding) -> None:
    with pytest.raises(ValueError, match="Invalid axis name: 'pp'"):
        grid.get_ranks(pp=0)
    with pytest.raises(IndexError, match=r"dp='1'"):
        grid.get_ranks(dp="1")  # type: ignore[arg-type]


def test_one_dimensional() -> None:
    line = NamedSharding([2, 0, 1], ["dp"])
    assert line.shape == {"dp": 3}
    assert line.get_worker_coords(2) == {"dp": 0}
    assert line.get_ranks(dp=1) == 0


def test_any_unique_integer_ranks() -> None:
    sharding = NamedSharding([[10, 3], [-2, 7]], ["a", "b"])
    assert sharding.size == 4
    assert sharding.get_worker_coords(-2) == {"a": 1, "b": 0}
    assert sharding.get_ranks_by_coord(b=1) == [3, 7]


def test_equality(grid: NamedSharding) -> None:
    assert grid == NamedSharding(np.array(GRID), ["dp", "tp"])
    assert grid != NamedSharding(GRID, ["a", "tp"])
    assert grid != NamedSharding([[1, 0], [2, 3], [4, 5]], ["dp", "tp"])
    assert grid != NamedSharding([0, 1, 2, 3, 4, 5], ["dp"])
    assert grid != "not a sharding"


def test_repr_shows_shape_names_and_layout(cube: NamedSharding) -> None:
    text = repr(cube)
    assert text.startswith("NamedSharding(shape=(1, 2, 4), names=['dp', 'pp', 'tp'], layout=")
    assert "4 5 6 7" in text


def test_replicated_axes_and_is_axis_zero() -> None:
    assert REPLICATED_AXES == ("tensor_parallel", "context_parallel", "pipeline_parallel")
    assert NamedSharding.REPLICATED_AXES == REPLICATED_AXES
    coords = {"data_parallel": 1, "tensor_parallel": 0, "pipeline_parallel": 0}
    assert NamedSharding.is_axis_zero(coords, REPLICATED_AXES) is True
    assert NamedSharding.is_axis_zero({**coords, "tensor_parallel": 1}, REPLICATED_AXES) is False
    assert NamedSharding.is_axis_zero(coords, ["data_parallel"]) is False
    assert NamedSharding.is_axis_zero({}, ["anything"]) is True


# ---- layouts -------------------------------------------------------------------------


def test_duplicate_ranks_are_named() -> None:
    with pytest.raises(ValueError, match=r"Duplicate ranks found.*\[1\]"):
        NamedSharding([[0, 1], [1, 2]], ["a", "b"])


def test_whole_number_floats_become_ints() -> None:
    sharding = NamedSharding([[0.0, 1.0], [2.0, 3.0]], ["a", "b"])
    assert np.issubdtype(sharding.layout.dtype, np.integer)
    assert sharding.get_ranks(a=1, b=0) == 2
    assert type(sharding.get_ranks(a=1, b=0)) is int


@pytest.mark.parametrize("bad", [1.5, "1", None, float("nan")])
def test_non_integer_ranks_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match=r"Layout must contain only integer rank IDs"):
        NamedSharding([[0, bad]], ["a", "b"])


def test_integer_like_ranks_accepted() -> None:
    class Index:
        def __init__(self, value: int) -> None:
            self.value = value

        def __index__(self) -> int:
            return self.value

    sharding = NamedSharding([Index(1), Index(0)], ["a"])
    assert sharding.layout.tolist() == [1, 0]


def test_names_count_must_match_ndim() -> None:
    with pytest.raises(ValueError, match=r"Number of dimensions.*\(2\).*must match.*\(1\)"):
        NamedSharding([[0, 1], [2, 3]], ["a"])
    with pytest.raises(ValueError, match=r"Number of dimensions.*must match"):
        NamedSharding([0, 1], ["a", "b"])


def test_duplicate_names_rejected() -> None:
    with pytest.raises(ValueError, match=r"'a'.*more than once"):
        NamedSharding([[0, 1]], ["a", "a"])


def test_non_string_names_rejected() -> None:
    with pytest.raises(ValueError, match=r"name"):
        NamedSharding([0, 1], [0])  # type: ignore[list-item]


def test_ragged_layout_rejected() -> None:
    with pytest.raises(ValueError, match=r"ragged|rectangular"):
        NamedSharding([[0, 1], [2]], ["a", "b"])
    with pytest.raises(ValueError, match=r"ragged|rectangular"):
        NamedSharding([[0, 1], 2], ["a", "b"])


def test_empty_layout_holds_no_ranks() -> None:
    empty = NamedSharding([], ["a"])
    assert empty.size == 0
    assert empty.get_ranks_by_coord() == []


class Index:
    """An integer-like value such as a NumPy integer: not an int, but has __index__."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"Index({self.value})"


GRID_SHARDING = NamedSharding(GRID, ["dp", "tp"])


def test_lookups_accept_integer_like_coordinates() -> None:
    assert GRID_SHARDING.get_ranks(dp=Index(2), tp=Index(1)) == 5
    assert GRID_SHARDING.get_ranks_by_coord(dp=Index(1)) == [2, 3]
    row = GRID_SHARDING.get_ranks(dp=Index(1))
    assert isinstance(row, NamedSharding) and row.layout.tolist() == [2, 3]
    assert GRID_SHARDING.get_worker_coords(Index(3)) == {"dp": 1, "tp": 1}


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_non_integer_coordinates_are_named_as_such(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"dp={bad!r}.*integer 0\.\.2"):
        GRID_SHARDING.get_ranks(dp=bad)  # type: ignore[arg-type]

"""NamedSharding: a rank layout over named axes, validated up front and queried by name."""

from __future__ import annotations

import pytest

from raylens.distributed.named_sharding import NamedSharding

# dp x tp: rank = dp * 2 + tp
GRID = [[0, 1], [2, 3], [4, 5]]


@pytest.fixture
def grid() -> NamedSharding:
    return NamedSharding(GRID, ["dp", "tp"])


def test_shape_names_ndim_size(grid: NamedSharding) -> None:
    assert grid.shape == {"dp": 3, "tp": 2}
    assert list(grid.shape) == ["dp", "tp"]
    assert grid.names == ["dp", "tp"]
    assert grid.ndim == 2
    assert grid.size == 6


def test_layout_is_a_copy(grid: NamedSharding) -> None:
    layout = grid.layout
    assert layout == GRID
    layout[0][0] = 99
    assert grid.layout == GRID


def test_names_is_a_copy(grid: NamedSharding) -> None:
    grid.names.append("pp")
    assert grid.names == ["dp", "tp"]


def test_accepts_tuples_and_copies_input() -> None:
    source = [[0, 1], [2, 3]]
    sharding = NamedSharding(source, ("a", "b"))
    source[0][0] = 3
    assert sharding.layout == [[0, 1], [2, 3]]


def test_accepts_objects_with_tolist() -> None:
    class ArrayLike:
        def tolist(self) -> list[list[int]]:
            return [[1, 0]]

    assert NamedSharding(ArrayLike(), ["x", "y"]).layout == [[1, 0]]


def test_axis_index_and_size(grid: NamedSharding) -> None:
    assert grid.get_axis_index("dp") == 0
    assert grid.get_axis_index("tp") == 1
    assert grid.get_axis_size("dp") == 3
    assert grid.get_axis_size("tp") == 2


@pytest.mark.parametrize("method", ["get_axis_index", "get_axis_size"])
def test_unknown_axis_is_named_in_error(grid: NamedSharding, method: str) -> None:
    with pytest.raises(ValueError, match=r"'pp'.*'dp', 'tp'"):
        getattr(grid, method)("pp")


def test_worker_coords(grid: NamedSharding) -> None:
    assert grid.get_worker_coords(0) == {"dp": 0, "tp": 0}
    assert grid.get_worker_coords(3) == {"dp": 1, "tp": 1}
    assert grid.get_worker_coords(4) == {"dp": 2, "tp": 0}


def test_worker_coords_of_permuted_layout() -> None:
    sharding = NamedSharding([[3, 1], [0, 2]], ["a", "b"])
    assert sharding.get_worker_coords(0) == {"a": 1, "b": 0}
    assert sharding.get_worker_coords(3) == {"a": 0, "b": 0}


@pytest.mark.parametrize("rank", [-1, 6, 100])
def test_worker_coords_out_of_range(grid: NamedSharding, rank: int) -> None:
    with pytest.raises(ValueError, match=rf"rank {rank}.*0\.\.5"):
        grid.get_worker_coords(rank)


def test_ranks_by_coord_full_and_partial(grid: NamedSharding) -> None:
    assert grid.get_ranks_by_coord(dp=1, tp=0) == [2]
    assert grid.get_ranks_by_coord(dp=1) == [2, 3]
    assert grid.get_ranks_by_coord(tp=1) == [1, 3, 5]
    assert grid.get_ranks_by_coord() == [0, 1, 2, 3, 4, 5]


def test_ranks_by_coord_are_sorted() -> None:
    sharding = NamedSharding([[5, 1], [4, 0], [2, 3]], ["a", "b"])
    assert sharding.get_ranks_by_coord(b=0) == [2, 4, 5]


def test_ranks_by_coord_rejects_unknown_axis_and_bad_index(grid: NamedSharding) -> None:
    with pytest.raises(ValueError, match="'pp'"):
        grid.get_ranks_by_coord(pp=0)
    with pytest.raises(ValueError, match=r"tp=2.*0\.\.1"):
        grid.get_ranks_by_coord(tp=2)
    with pytest.raises(ValueError, match=r"dp=-1"):
        grid.get_ranks_by_coord(dp=-1)


def test_get_ranks_fully_indexed_is_an_int(grid: NamedSharding) -> None:
    assert grid.get_ranks(dp=2, tp=1) == 5
    assert isinstance(grid.get_ranks(dp=2, tp=1), int)


def test_get_ranks_partial_is_a_named_sub_sharding(grid: NamedSharding) -> None:
    row = grid.get_ranks(dp=1)
    assert isinstance(row, NamedSharding)
    assert row.names == ["tp"]
    assert row.layout == [2, 3]
    column = grid.get_ranks(tp=1)
    assert isinstance(column, NamedSharding)
    assert column.names == ["dp"]
    assert column.layout == [1, 3, 5]


def test_sub_sharding_keeps_global_ranks() -> None:
    cube = NamedSharding([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ["pp", "dp", "tp"])
    plane = cube.get_ranks(pp=1)
    assert isinstance(plane, NamedSharding)
    assert plane.names == ["dp", "tp"]
    assert plane.layout == [[4, 5], [6, 7]]
    assert plane.get_ranks(dp=0, tp=1) == 5
    middle = cube.get_ranks(dp=1)
    assert isinstance(middle, NamedSharding)
    assert middle.names == ["pp", "tp"]
    assert middle.layout == [[2, 3], [6, 7]]


def test_get_ranks_without_index_is_the_whole_sharding(grid: NamedSharding) -> None:
    assert grid.get_ranks() == grid


def test_get_ranks_rejects_unknown_axis_and_bad_index(grid: NamedSharding) -> None:
    with pytest.raises(ValueError, match="'pp'"):
        grid.get_ranks(pp=0)
    with pytest.raises(ValueError, match=r"dp=3.*0\.\.2"):
        grid.get_ranks(dp=3)
    with pytest.raises(ValueError, match=r"dp='1'"):
        grid.get_ranks(dp="1")  # type: ignore[arg-type]


def test_one_dimensional() -> None:
    line = NamedSharding([2, 0, 1], ["dp"])
    assert line.shape == {"dp": 3}
    assert line.get_worker_coords(2) == {"dp": 0}
    assert line.get_ranks(dp=1) == 0


def test_equality_and_repr(grid: NamedSharding) -> None:
    assert grid == NamedSharding([[0, 1], [2, 3], [4, 5]], ["dp", "tp"])
    assert grid != NamedSharding([[0, 1], [2, 3], [4, 5]], ["a", "tp"])
    assert grid != NamedSharding([[1, 0], [2, 3], [4, 5]], ["dp", "tp"])
    assert grid != "not a sharding"
    text = repr(grid)
    assert "dp" in text and "tp" in text and "[[0, 1], [2, 3], [4, 5]]" in text


# ---- invalid layouts ------------------------------------------------------------------


def test_duplicate_ranks_are_named() -> None:
    with pytest.raises(ValueError, match=r"duplicate.*\b1\b"):
        NamedSharding([[0, 1], [1, 2]], ["a", "b"])


def test_ranks_must_be_zero_to_n_minus_one() -> None:
    with pytest.raises(ValueError, match=r"0\.\.3.*missing \[0\].*unexpected \[4\]"):
        NamedSharding([[1, 2], [3, 4]], ["a", "b"])


def test_negative_rank_rejected() -> None:
    with pytest.raises(ValueError, match=r"-1"):
        NamedSharding([-1, 0], ["a"])


@pytest.mark.parametrize("bad", [1.0, "1", None, True])
def test_non_integer_ranks_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match=r"integer"):
        NamedSharding([[0, bad]], ["a", "b"])


def test_integer_like_ranks_accepted() -> None:
    class Index:
        def __init__(self, value: int) -> None:
            self.value = value

        def __index__(self) -> int:
            return self.value

    sharding = NamedSharding([Index(1), Index(0)], ["a"])
    assert sharding.layout == [1, 0]
    assert type(sharding.layout[0]) is int


def test_names_count_must_match_ndim() -> None:
    with pytest.raises(ValueError, match=r"2 dimensions.*1 name"):
        NamedSharding([[0, 1], [2, 3]], ["a"])
    with pytest.raises(ValueError, match=r"1 dimension.*2 names"):
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


def test_empty_and_scalar_layouts_rejected() -> None:
    with pytest.raises(ValueError, match=r"empty|no ranks"):
        NamedSharding([], ["a"])
    with pytest.raises(ValueError, match=r"empty|no ranks"):
        NamedSharding([[], []], ["a", "b"])
    with pytest.raises(ValueError, match=r"sequence|list"):
        NamedSharding(0, [])  # type: ignore[arg-type]

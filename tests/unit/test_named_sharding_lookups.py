"""NamedSharding lookups take the same integer-like values its layouts accept."""

from __future__ import annotations

import pytest

from raylens.distributed.named_sharding import NamedSharding


class Index:
    """An integer-like value such as a NumPy integer: not an int, but has __index__."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"Index({self.value})"


GRID = NamedSharding([[0, 1], [2, 3], [4, 5]], ["dp", "tp"])


def test_lookups_accept_integer_like_coordinates() -> None:
    assert GRID.get_ranks(dp=Index(2), tp=Index(1)) == 5
    assert GRID.get_ranks_by_coord(dp=Index(1)) == [2, 3]
    row = GRID.get_ranks(dp=Index(1))
    assert isinstance(row, NamedSharding) and row.layout.tolist() == [2, 3]
    assert GRID.get_worker_coords(Index(3)) == {"dp": 1, "tp": 1}


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_non_integer_coordinates_are_named_as_such(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"dp={bad!r}.*integer 0\.\.2"):
        GRID.get_ranks(dp=bad)  # type: ignore[arg-type]

"""The bundled raylet captures load wherever the package is imported from."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from raylens.simulation import raylet
from raylens.simulation.raylet import RECORDED_PAYLOADS, load_recorded_payload


class _OneStepTraversable:
    """A package resource that, like Python 3.10's zip reader, joins one name per call."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def joinpath(self, child: str) -> _OneStepTraversable:
        return _OneStepTraversable(self._path / child)

    def __truediv__(self, child: str) -> _OneStepTraversable:
        return self.joinpath(child)

    def read_bytes(self) -> bytes:
        return self._path.read_bytes()


@pytest.mark.parametrize("filename", RECORDED_PAYLOADS)
def test_captures_load_from_a_reader_that_joins_one_name_at_a_time(
    monkeypatch: pytest.MonkeyPatch, filename: str
) -> None:
    expected = load_recorded_payload(filename)
    package = Path(raylet.__file__).parent
    reader = SimpleNamespace(files=lambda name: _OneStepTraversable(package))
    monkeypatch.setattr(raylet, "resources", reader)
    assert load_recorded_payload(filename) == expected
    assert b"ray_node_mem_used" in expected

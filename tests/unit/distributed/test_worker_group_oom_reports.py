"""A group call failing with Ray's out-of-memory error reports its victim, and still raises."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raylens.distributed._worker_dispatch import MultiWorkerFuture
from raylens.telemetry.oom import DEFAULT_LEDGER, reset_oom_state


class OutOfMemoryError(Exception):
    """Stands for ``ray.exceptions.OutOfMemoryError``."""


class Ref:
    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


class StandInRay:
    ObjectRefGenerator = type("ObjectRefGenerator", (), {})
    exceptions = SimpleNamespace(OutOfMemoryError=OutOfMemoryError)

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        for ref in refs if isinstance(refs, list) else [refs]:
            if ref.error is not None:
                raise ref.error
        return [r.value for r in refs] if isinstance(refs, list) else refs.value

    def wait(self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None) -> Any:
        return refs, []


def _group() -> Any:
    ray = StandInRay()
    identities = [("node-a", 100, 1), ("node-b", 200, 2), ("node-b", 300, 3)]
    return SimpleNamespace(
        name_prefix="policy",
        _seam=SimpleNamespace(ray=lambda: ray),
        _processes=SimpleNamespace(identities=identities),
        worker_to_tied_group_index={},
    )


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    reset_oom_state()
    yield
    reset_oom_state()


def test_the_victim_is_reported_with_its_group_rank_pid_and_node() -> None:
    futures = [Ref(1), Ref(error=OutOfMemoryError("killed by the memory monitor"))]
    bundle = MultiWorkerFuture(futures, called_workers=[0, 2])
    with pytest.raises(OutOfMemoryError):
        bundle.get_results(_group())
    (report,) = DEFAULT_LEDGER.take_reports()
    assert report.node_id == "node-b"
    assert (report.victim.group, report.victim.worker_rank, report.victim.pid) == ("policy", 2, 300)


def test_other_errors_report_nothing() -> None:
    bundle = MultiWorkerFuture([Ref(error=RuntimeError("a bug"))], called_workers=[0])
    with pytest.raises(RuntimeError):
        bundle.get_results(_group())
    assert DEFAULT_LEDGER.take_reports() == []

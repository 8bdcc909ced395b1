"""The demo's first frame waits, boundedly, for every labelled node's group figures."""

from __future__ import annotations

from raylens.cli.demo_frames import wait_for_group_figures
from raylens.live_table import NodeRow
from raylens_fakes.clock import ClockedStop, ManualClock


class Scripted:
    """A monitor and table whose nodes get group figures at ``figures_at`` (simulated s)."""

    def __init__(self, clock: ManualClock, figures_at: float) -> None:
        self.clock, self.figures_at, self.collections = clock, figures_at, 0

    def collect_once(self) -> None:
        self.collections += 1

    def rows(self) -> list[NodeRow]:
        ready = self.clock() >= self.figures_at
        return [
            NodeRow("a", "h", 1.0, 2.0, "policy", 0.0, group_rss={"policy": 1.0} if ready else {}),
            NodeRow("b", "h", 1.0, 2.0, "none", 0.0),  # no group: nothing to wait for
        ]


def test_the_first_frame_comes_as_soon_as_every_labelled_node_has_figures() -> None:
    clock = ManualClock()
    scripted = Scripted(clock, figures_at=2.0)
    assert wait_for_group_figures(
        scripted, scripted, stop=ClockedStop(clock), clock=clock, within_s=20.0, poll_s=0.5
    )
    assert clock.now == 2.0 and scripted.collections == 5


def test_the_wait_is_bounded_and_a_stop_ends_it() -> None:
    clock = ManualClock()
    never = Scripted(clock, figures_at=float("inf"))
    assert not wait_for_group_figures(
        never, never, stop=ClockedStop(clock), clock=clock, within_s=3.0, poll_s=0.5
    )
    assert clock.now == 3.0
    stopped = ClockedStop(clock)
    stopped.set()
    assert not wait_for_group_figures(
        never, never, stop=stopped, clock=clock, within_s=3.0, poll_s=0.5
    )


class Marker:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def enter(self, name: str) -> str:
        self.calls.append(("enter", name))
        return f"token-{len(self.calls)}"

    def leave(self, name: str, token: str | None = None) -> None:
        self.calls.append(("leave", f"{name} {token}"))


def test_the_demo_marks_its_phases_in_turn_and_ends_the_last_one() -> None:
    from raylens.demo import DemoPhases

    clock, marker = ManualClock(), Marker()
    phases = DemoPhases(clock=clock, phases=[("gen", 4.0), ("train", 2.0)], marker=marker)
    for _ in range(5):  # samples 2 s apart: 0, 2, 4, 6, 8
        phases.step()
        clock.now += 2.0
    phases.close()
    phases.close()
    assert marker.calls == [
        ("enter", "gen"),
        ("leave", "gen token-1"),  # at 4
        ("enter", "train"),
        ("leave", "train token-3"),  # at 6
        ("enter", "gen"),
        ("leave", "gen token-5"),  # at the end
    ]

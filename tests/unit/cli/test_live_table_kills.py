"""Recent OOM kills under the node table: one line each, the latest few, untrusted text escaped."""

from __future__ import annotations

import io

from rich.console import Console

from raylens.live_table import KILLS_SHOWN, NodeRow, format_kill, node_table


def _render(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=False, color_system=None).print(renderable)
    return out.getvalue()


def _kill(**changes: object) -> dict[str, object]:
    kill: dict[str, object] = {
        "node_id": "23fba39f" + "0" * 48,
        "host": "vm",
        "killer": "ray",
        "unix_time": 1000.0,
        "worker_group": "policy",
        "worker_rank": 1,
        "pid": 4242,
        "postmortem": "/tmp/raylens-postmortems/oom-x.json",
    }
    kill.update(changes)
    return kill


def test_a_kill_line_names_the_group_the_killer_and_the_file() -> None:
    assert format_kill(_kill(), now=1012.0) == (
        "OOM kill 12s ago on 23fba39f: worker group policy rank 1 pid 4242, by Ray's memory "
        "monitor; post-mortem /tmp/raylens-postmortems/oom-x.json"
    )
    unknown = _kill(worker_group=None, worker_rank=None, pid=None, killer="kernel", postmortem=None)
    assert format_kill(unknown) == "OOM kill on 23fba39f: unknown group, by the kernel"
    assert "\x1b" not in format_kill(_kill(worker_group="\x1b[2Jevil"))


def test_the_table_lists_the_latest_kills_under_it() -> None:
    row = NodeRow(node_id="n1", host="vm", used=1.0, total=2.0, worker_groups="none", age_s=0.0)
    lines = [format_kill(_kill(pid=pid)) for pid in range(KILLS_SHOWN + 2)]
    text = _render(node_table([row], kills=lines))
    assert text.count("OOM kill") == KILLS_SHOWN
    assert "pid 0," not in text and f"pid {KILLS_SHOWN + 1}," in text

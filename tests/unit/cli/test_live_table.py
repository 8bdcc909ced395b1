from __future__ import annotations

import io

import pytest
from rich.console import Console

from raylens.live_table import (
    NodeRow,
    ProcessTreeRow,
    format_age,
    format_bytes,
    node_table,
    process_table,
    sparkline,
)


def _render(renderable) -> str:
    out = io.StringIO()
    Console(file=out, width=160, force_terminal=False, color_system=None).print(renderable)
    return out.getvalue()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (float("nan"), "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (3 * 1024**3, "3.0 GiB"),
        (2.5276063744e10, "23.5 GiB"),
        (5 * 1024**6, "5120.0 PiB"),
    ],
)
def test_format_bytes(value, text: str) -> None:
    assert format_bytes(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "-"), (0.42, "0.4s"), (12.4, "12s"), (185, "3m05s")]
)
def test_format_age(seconds, text: str) -> None:
    assert format_age(seconds) == text


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([0, 7, 14]) == "▁▅█"
    assert sparkline([5, 5, 5]) == "▅▅▅"
    assert sparkline([]) == ""
    assert len(sparkline(list(range(100)), width=12)) == 12


def test_node_table_shows_every_column_and_errors() -> None:
    rows = [
        NodeRow(
            "bbbbbbbbbbbbbbbb", "host-a", 2 * 1024**3, 4 * 1024**3, "policy", 1.2, None, [1, 2]
        ),
        NodeRow("aaaaaaaaaaaaaaaa", "host-a", None, None, "rollout", None, "timed out"),
    ]
    text = _render(node_table(rows))
    for expected in ("aaaaaaaa", "bbbbbbbb", "2.0 GiB", "4.0 GiB", "50.0%", "policy", "timed out"):
        assert expected in text
    assert text.index("aaaaaaaa") < text.index("bbbbbbbb")
    assert "aaaaaaaaa" not in text


def test_node_row_json() -> None:
    row = NodeRow("n1", "h", 1.0, 4.0, "none", 0.12345, scrape_age_s=0.01, group_age_s=8.0)
    assert row.to_json() == {
        "node_id": "n1",
        "host": "h",
        "used_bytes": 1,
        "total_bytes": 4,
        "used_percent": 25.0,
        "worker_groups": "none",
        "age_seconds": 0.123,
        "scrape_age_seconds": 0.01,
        "worker_group_age_seconds": 8.0,
        "error": None,
        "worker_group_rss_bytes": {},
        "growth_bytes_per_second": None,
        "worker_group_growth_bytes_per_second": {},
        "limit_bytes": None,
        "time_to_limit_seconds": None,
        "fastest_growing_group": None,
        "growth_unavailable": None,
        "warning": None,
    }


def test_a_node_that_reaches_its_kill_line_within_the_hour_gets_a_warning_naming_its_fastest_group() -> (
    None
):
    gib, mib = 1024**3, 1024**2
    growing = NodeRow(
        "a" * 16,
        "host-a",
        58 * gib,
        64 * gib,
        "policy,rollout",
        1.0,
        growth=3 * mib,
        group_growth={"policy": 3 * mib, "rollout": 0.0},
        limit=0.95 * 64 * gib,
        time_to_limit=(0.95 * 64 - 58) * gib / (3 * mib),
        fastest_group="policy",
    )
    distant = NodeRow(
        "b" * 16,
        "host-a",
        10 * gib,
        64 * gib,
        "rollout",
        1.0,
        growth=1.0,
        limit=60.8 * gib,
        time_to_limit=4e10,
    )
    # The caption wraps at the table's width: compare its words, not its line breaks.
    text = " ".join(_render(node_table([growing, distant])).split())
    assert "+10.5 GiB/h" in text and "growth" in text
    assert (
        "warning: node aaaaaaaa (host-a) reaches its kill line (60.8 GiB) in about 16 min" in text
    )
    assert "policy grows fastest there (+10.5 GiB/h)" in text
    assert "bbbbbbbb (host-a) reaches" not in text
    assert growing.to_json()["warning"] == growing.warning
    assert growing.to_json()["growth_bytes_per_second"] == 3 * mib
    assert distant.warning is None


def test_the_growth_column_appears_only_once_a_node_has_a_figure() -> None:
    assert "growth" not in _render(node_table([NodeRow("a" * 16, "h", 1.0, 4.0, "none", 1.0)]))


def test_group_rss_column_shows_each_group_on_its_node_only_when_there_is_one() -> None:
    mib = 1024**2
    plain = [NodeRow("a" * 16, "host-a", 1.0, 4.0, "policy,rollout", 1.0)]
    assert "group rss" not in _render(node_table(plain))

    rows = [
        NodeRow(
            "a" * 16,
            "host-a",
            1.0,
            4.0,
            "policy,rollout",
            1.0,
            group_rss={"rollout": 64 * mib, "policy": 364 * mib},
        ),
        NodeRow("b" * 16, "host-b", 1.0, 4.0, "none", 1.0),
    ]
    text = _render(node_table(rows))
    assert "group rss" in text
    assert "policy 364.0 MiB, rollout 64.0 MiB" in text
    assert rows[0].to_json()["worker_group_rss_bytes"] == {
        "rollout": 64 * mib,
        "policy": 364 * mib,
    }


def test_process_table_and_json() -> None:
    row = ProcessTreeRow("python", 42, 3, 3 * 1024**2, None, None, 4 * 1024**2, None)
    text = _render(process_table([row]))
    assert "python" in text and "3.0 MiB" in text and "4.0 MiB" in text
    assert row.to_json()["pss_bytes"] is None
    assert row.to_json()["processes"] == 3


def test_sparkline_draws_noise_flat_given_a_minimum_span() -> None:
    gib = 1024**3
    noisy = [10 * gib, 10 * gib + 2 * 1024**2, 10 * gib + 4 * 1024**2]
    assert sparkline(noisy) == "▁▅█"
    assert len(set(sparkline(noisy, min_span=0.05 * 64 * gib))) == 1
    rising = [10 * gib, 20 * gib, 30 * gib]
    assert sparkline(rising, min_span=0.05 * 64 * gib) == "▁▅█"


def test_node_table_on_an_80_column_terminal_keeps_figures_and_groups_whole() -> None:
    gib = 1024**3
    rows = [
        NodeRow("a" * 56, "ip-10-0-0-1.ec2.internal", 38 * gib, 64 * gib, "policy,rollout", 1.0),
        NodeRow(
            "b" * 56,
            "ip-10-0-0-2.ec2.internal",
            None,
            None,
            "rollout",
            None,
            "timed out waiting for the raylet to answer",
        ),
    ]
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False, color_system=None).print(node_table(rows))
    text = out.getvalue()
    # Two columns stay free: a terminal echoes Ctrl-C as "^C" after the last line,
    # and on a full-width line that wraps and throws a live display's redraw off.
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 78
    for whole in ("aaaaaaaa", "bbbbbbbb", "38.0 GiB", "64.0 GiB", "59.4%", "policy,rollout"):
        assert whole in text, text
    assert "timed out" in text, text


def test_process_table_on_an_80_column_terminal_keeps_the_figures_whole() -> None:
    mib = 1024**2
    row = ProcessTreeRow(
        "python -c " + "x" * 60, 31846, 3, 60 * mib, 55 * mib, 0.0, 61 * mib, 56 * mib
    )
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False, color_system=None).print(process_table([row]))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    for whole in ("60.0 MiB", "55.0 MiB", "61.0 MiB", "python -c"):
        assert whole in text, text


def test_a_wide_terminal_shows_every_column_and_the_whole_error() -> None:
    rows = [
        NodeRow("a" * 56, "ip-10-0-0-1.ec2.internal", 1, 4, "policy", 1.0, None, [1, 2]),
        NodeRow("b" * 56, "ip-10-0-0-2.ec2.internal", None, None, "rollout", None, "timed out x"),
    ]
    text = _render(node_table(rows))
    assert "ip-10-0-0-1.ec2.internal" in text and "trend" in text and "▁█" in text
    assert "timed out x" in text


_HOSTILE = "[bold]x[/] data[/train] [link=http://e]"


def test_outside_text_is_shown_as_written_never_as_markup() -> None:
    rows = [
        NodeRow(_HOSTILE + "aaaa", _HOSTILE, 1, 4, _HOSTILE, 1.0),
        NodeRow("[/]bbbbbbbbbb", "h", None, None, "none", None, _HOSTILE),
    ]
    text = _render(node_table(rows, title="at " + _HOSTILE))
    assert "at " + _HOSTILE in text
    assert "[/]bbbbb" in text
    assert text.count("data[/train]") >= 3, text
    process = _render(
        process_table([ProcessTreeRow(_HOSTILE, 1, 1, 1, 1, 0, 1, 1)], title=_HOSTILE)
    )
    assert process.count(_HOSTILE[:12]) >= 2, process


def test_control_characters_are_escaped_in_every_cell_and_the_title() -> None:
    hostile = "500 \x1b]0;PWNED\x07\x1b[2J"
    rows = [NodeRow("n\x1b[2J", "h\x1b]0;t\x07", None, None, "g\x1b[31m", None, hostile)]
    text = _render(node_table(rows, title="t\x1b[2J"))
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;PWNED\\x07" in text and "t\\x1b[2J" in text
    process = _render(process_table([ProcessTreeRow("p\x1b[2J", 1, 1, 1, 1, 0, 1, 1)]))
    assert "\x1b" not in process and "p\\x1b" in process


def test_bidi_and_zero_width_characters_in_group_names_are_escaped() -> None:
    names = "gpu\u202eloop,\u200bpolicy"
    rows = [NodeRow("n" * 56, "h", 1, 2, names, None, group_rss={"rl\u2066x": 1024.0})]
    text = _render(node_table(rows, title="t"))
    assert not {"\u202e", "\u200b", "\u2066"} & set(text)
    assert "gpu\\u202eloop" in text and "\\u200bpolicy" in text and "rl\\u2066x" in text


def test_nodes_are_in_natural_order() -> None:
    rows = [NodeRow(f"id{i:02d}xxxxxx", f"sim-node-{i}", 1, 4, "none", 1.0) for i in (10, 2, 1, 11)]
    text = _render(node_table(rows))
    order = [text.index(f"sim-node-{i} ") for i in (1, 2, 10, 11)]
    assert order == sorted(order), text


def test_a_summary_line_counts_nodes_failures_and_memory() -> None:
    from raylens.live_table import node_summary

    gib = 1024**3
    rows = [
        NodeRow("a" * 16, "h1", 16 * gib, 64 * gib, "policy", 1.0),
        NodeRow("b" * 16, "h2", 48 * gib, 64 * gib, "rollout", 1.0),
        NodeRow("c" * 16, "h3", None, None, "rollout", None, "timed out"),
    ]
    summary = node_summary(rows)
    assert summary.to_json() == {
        "nodes": 3,
        "hosts": 3,
        "failing": 1,
        "used_bytes": 64 * gib,
        "total_bytes": 128 * gib,
        "used_percent": 50.0,
    }
    assert str(summary) == "3 nodes on 3 hosts, 1 failing, 64.0 GiB of 128.0 GiB used (50.0%)"
    assert str(summary) in _render(node_table(rows))
    assert str(node_summary([])) == "0 nodes, 0 failing"


def _render_at(renderable, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False, color_system=None).print(renderable)
    return out.getvalue()


def test_the_kernel_peak_is_shown_beside_the_sampled_one_and_labelled() -> None:
    mib = 1024**2
    row = ProcessTreeRow(
        "python spike.py",
        7,
        1,
        8 * mib,
        8 * mib,
        0.0,
        8.5 * mib,
        8 * mib,
        kernel_peak=408 * mib,
        kernel_peak_source="VmHWM",
    )
    text = _render(process_table([row]))
    assert "8.5 MiB" in text and "408.0 MiB" in text, text
    assert "kernel peak" in text and "sampled" in text and "VmHWM" in text, text
    assert row.to_json()["kernel_peak_rss_bytes"] == 408 * mib
    assert row.to_json()["kernel_peak_rss_source"] == "VmHWM"
    assert row.to_json()["rss_peak_bytes"] == 8.5 * mib
    after = ProcessTreeRow(
        "python spike.py",
        7,
        0,
        None,
        None,
        None,
        8.5 * mib,
        None,
        kernel_peak=408 * mib,
        kernel_peak_source="ru_maxrss",
    )
    text = _render(process_table([after]))
    assert "408.0 MiB" in text and "ru_maxrss" in text and "VmHWM" not in text, text
    unknown = ProcessTreeRow("sh", 7, 1, 1, 1, 0, 1, 1)
    assert unknown.to_json()["kernel_peak_rss_bytes"] is None
    assert "kernel peak:" not in _render(process_table([unknown]))


def test_a_stale_pss_is_shown_as_a_dash_with_its_age() -> None:
    mib = 1024**2
    stale = ProcessTreeRow("train", 7, 2, 211 * mib, None, 75.0, 211 * mib, 1, pss_stale=True)
    text = _render(process_table([stale]))
    assert "- stale" in text and "1m15s" in text, text
    record = stale.to_json()
    assert (record["pss_bytes"], record["pss_stale"], record["pss_age_seconds"]) == (
        None,
        True,
        75.0,
    )
    fresh = ProcessTreeRow("train", 7, 2, 211 * mib, 39 * 1024, 4.0, 211 * mib, 39 * 1024)
    assert fresh.to_json()["pss_stale"] is False
    assert "stale" not in _render(process_table([fresh]))


def test_an_80_column_table_keeps_the_pss_age_beside_the_pss() -> None:
    mib = 1024**2
    row = ProcessTreeRow(
        "python -c " + "x" * 60,
        31846,
        3,
        211 * mib,
        39 * 1024,
        25.0,
        211 * mib,
        1 * mib,
        kernel_peak=408 * mib,
        kernel_peak_source="VmHWM",
    )
    text = _render_at(process_table([row]), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    for whole in ("211.0 MiB", "39.0 KiB", "25s", "408.0 MiB", "1.0 MiB", "python -c"):
        assert whole in text, text


def test_nodes_without_growth_get_one_line_per_reason_under_the_table_and_a_json_field() -> None:
    from raylens.live_table import growth_unavailable_lines
    from raylens.telemetry.growth_outlook import NO_SAMPLER

    rows = [
        NodeRow(f"node{i}" + "f" * 50, "h", 1.0, 4.0, "none", 0.1, growth_unavailable=NO_SAMPLER)
        for i in range(5)
    ]
    rows.append(NodeRow("fresh" + "e" * 51, "h", 1.0, 4.0, "none", 0.1, growth=1e6))
    (line,) = growth_unavailable_lines(rows)
    assert line == (
        f"growth unavailable on 5 node(s) (node0fff, node1fff, node2fff and 2 more): {NO_SAMPLER}"
    )
    text = _render(node_table(rows))
    assert "growth unavailable on 5 node(s)" in " ".join(text.split())
    assert rows[0].to_json()["growth_unavailable"] == NO_SAMPLER
    assert rows[-1].to_json()["growth_unavailable"] is None

"""Writing post-mortems: where, under which name, privately, atomically, bounded, never raising."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raylens.telemetry.oom import Killer, PostMortemWriter, Victim, _postmortem, build_postmortem
from raylens.telemetry.oom._bounds import MAX_GROUPS_SHOWN, MAX_POSTMORTEM_BYTES
from raylens.telemetry.oom._postmortem import (
    POSTMORTEM_DIR_ENV,
    default_postmortem_dir,
    reset_postmortem_budget,
)


@pytest.fixture(autouse=True)
def _fresh_budget() -> Iterator[None]:
    reset_postmortem_budget()
    yield
    reset_postmortem_budget()


def _document(node_id: str = "a" * 56) -> dict[str, Any]:
    return build_postmortem(
        node_id=node_id,
        host="vm",
        killer=Killer.KERNEL,
        wall_time=1.7e9,
        victims=[Victim("policy", 0, 7)],
        phase=None,
        limit_bytes=None,
        used_bytes=None,
        total_bytes=None,
        history=None,
    )


def test_the_directory_is_the_setting_else_one_in_the_temp_dir(tmp_path: Path) -> None:
    assert default_postmortem_dir({POSTMORTEM_DIR_ENV: str(tmp_path)}) == tmp_path
    assert default_postmortem_dir({POSTMORTEM_DIR_ENV: "  "}) == (
        Path(tempfile.gettempdir()) / f"raylens-postmortems-{os.getuid()}"
    )


def test_a_hostile_node_id_cannot_steer_the_file_name(tmp_path: Path) -> None:
    writer = PostMortemWriter(tmp_path / "made")
    path = writer.write(_document("../../etc/passwd\n\x1b[2J" + "b" * 40))
    assert path is not None and path.parent == tmp_path / "made"
    assert re.fullmatch(
        r"oom-20231114T221320-kernel-etcpasswd[0-9A-Za-z]{7}-\d+-[0-9a-f]{8}\.json", path.name
    )
    assert json.loads(path.read_text())["node_id"].startswith("../../etc/passwd\\x0a\\x1b")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_an_amendment_replaces_the_file_whole(tmp_path: Path) -> None:
    writer = PostMortemWriter(tmp_path)
    path = writer.write(_document())
    assert path is not None

    def change(document: dict[str, Any]) -> None:
        document["phase"] = "train"

    assert writer.amend(path, change) == path
    assert json.loads(path.read_text())["phase"] == "train"
    assert writer.written == 1 and len(os.listdir(tmp_path)) == 1


def test_files_stop_at_the_cap_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = PostMortemWriter(tmp_path, max_files=2)
    with caplog.at_level(logging.WARNING, logger="raylens.oom"):
        paths = [writer.write(_document()) for _ in range(4)]
    assert paths[2:] == [None, None] and len(os.listdir(tmp_path)) == 2
    assert len(caplog.records) == 1 and "2 OOM post-mortems" in caplog.records[0].getMessage()


def test_a_directory_that_cannot_be_made_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = PostMortemWriter(blocker / "sub")
    with caplog.at_level(logging.WARNING, logger="raylens.oom"):
        assert writer.write(_document()) is None
        assert writer.write(_document()) is None
    assert len(caplog.records) == 1 and POSTMORTEM_DIR_ENV in caplog.records[0].getMessage()


def test_a_bad_cap_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="max_files must be an int of at least 0, got -1"):
        PostMortemWriter(max_files=-1)


def test_two_writers_in_one_second_never_overwrite_each_other(tmp_path: Path) -> None:
    first, second = PostMortemWriter(tmp_path), PostMortemWriter(tmp_path)
    paths = [first.write(_document()), second.write(_document()), first.write(_document())]
    assert None not in paths and len(set(paths)) == 3
    assert len(os.listdir(tmp_path)) == 3


def test_a_name_already_taken_is_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = PostMortemWriter(tmp_path)
    taken = writer.write(_document())
    assert taken is not None
    names = iter([taken.name, "oom-fresh.json"])
    monkeypatch.setattr(writer, "name_for", lambda document: next(names))
    path = writer.write(_document("b" * 56))
    assert path == tmp_path / "oom-fresh.json"
    assert json.loads(taken.read_text())["node_id"] == "a" * 56


def test_the_cap_is_per_process_and_failed_writes_do_not_use_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    broken = PostMortemWriter(blocker / "sub", max_files=2)
    assert [broken.write(_document()) for _ in range(3)] == [None, None, None]
    first, second = (
        PostMortemWriter(tmp_path / "a", max_files=2),
        PostMortemWriter(tmp_path / "b", max_files=2),
    )
    assert first.write(_document()) is not None
    assert second.write(_document()) is not None
    assert first.write(_document()) is None and second.write(_document()) is None


def test_files_are_private_to_the_user(tmp_path: Path) -> None:
    path = PostMortemWriter(tmp_path).write(_document())
    assert path is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.fixture
def default_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(POSTMORTEM_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path / f"raylens-postmortems-{os.getuid()}"


def test_the_default_directory_is_made_private(default_dir: Path) -> None:
    path = PostMortemWriter().write(_document())
    assert path is not None and path.parent == default_dir
    assert stat.S_IMODE(default_dir.stat().st_mode) == 0o700


def test_a_default_directory_left_open_to_others_is_closed(default_dir: Path) -> None:
    default_dir.mkdir(mode=0o777)
    default_dir.chmod(0o777)
    assert PostMortemWriter().write(_document()) is not None
    assert stat.S_IMODE(default_dir.stat().st_mode) == 0o700


def test_a_symlink_planted_as_the_default_directory_is_not_followed(
    default_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    default_dir.symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="raylens.oom"):
        assert PostMortemWriter().write(_document()) is None
    assert list(elsewhere.iterdir()) == []
    assert "symbolic link" in caplog.records[0].getMessage()


def test_a_default_directory_another_user_owns_is_refused(
    default_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    default_dir.mkdir(mode=0o700)
    monkeypatch.setattr(_postmortem.os, "getuid", lambda: os.stat(default_dir).st_uid + 1)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(default_dir.parent))
    writer = PostMortemWriter(default_dir)
    writer._strict = True  # the default directory's checks, on a directory named here
    with caplog.at_level(logging.WARNING, logger="raylens.oom"):
        assert writer.write(_document()) is None
    assert list(default_dir.iterdir()) == []
    assert "belongs to user id" in caplog.records[0].getMessage()


def _history(groups: int, points: int) -> dict[str, Any]:
    def series(base: float, slope: float) -> dict[str, Any]:
        samples = [[float(t - points), round(base + slope * t)] for t in range(points)]
        buckets = [[-1200.0 + t, -1199.0 + t, base, base, base] for t in range(points)]
        return {"samples": samples, "buckets": buckets}

    return {
        "node_used": series(40e9, 1e6),
        "outside_groups": series(2e9, 0.0),
        "worker_groups": {
            f"group-{i:03d}": series(1e8 + i * 1e6, 5e5 if i % 17 == 0 else 0.0)
            for i in range(groups)
        },
    }


def test_a_node_with_256_groups_gives_one_post_mortem_within_256_kib(tmp_path: Path) -> None:
    document = build_postmortem(
        node_id="n" * 56,
        host="vm",
        killer=Killer.RAY,
        wall_time=1.7e9,
        phase="train",
        limit_bytes=60e9,
        used_bytes=59e9,
        total_bytes=64e9,
        history=_history(256, 600),  # type: ignore[arg-type]
    )
    groups = document["worker_groups"]
    assert len(groups) == MAX_GROUPS_SHOWN
    assert "group-255" in groups  # the largest
    assert "group-000" in groups  # grows fastest of the small ones
    other = document["other_groups"]
    assert other["groups"] == 256 - MAX_GROUPS_SHOWN
    path = PostMortemWriter(tmp_path).write(document)
    assert path is not None
    assert path.stat().st_size <= MAX_POSTMORTEM_BYTES
    written = json.loads(path.read_text())
    assert written["thinned"] is True and written["worker_groups"]["group-255"]["samples"]


def test_a_post_mortem_lists_a_bounded_number_of_victims_and_counts_the_rest() -> None:
    victims = [Victim(None, None, None, f"Task{i}") for i in range(40)]
    document = build_postmortem(
        node_id="n",
        host="vm",
        killer=Killer.RAY,
        wall_time=1.7e9,
        victims=victims,
        kills=40,
        phase=None,
        limit_bytes=None,
        used_bytes=None,
        total_bytes=None,
        history=None,
    )
    assert len(document["victims"]) == 16 and document["victims_not_listed"] == 24
    assert document["kills"] == 40 and document["victim"]["ray_name"] == "Task0"

"""Writing post-mortems: where, under which name, atomically, bounded, never raising."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path

import pytest

from raylens.telemetry.oom import (
    POSTMORTEM_DIR_ENV,
    Killer,
    PostMortemWriter,
    Victim,
    build_postmortem,
    default_postmortem_dir,
)


def _document(node_id: str = "a" * 56) -> dict[str, object]:
    return build_postmortem(
        node_id=node_id,
        host="vm",
        killer=Killer.KERNEL,
        wall_time=1.7e9,
        victim=Victim("policy", 0, 7),
        phase=None,
        limit_bytes=None,
        used_bytes=None,
        total_bytes=None,
        history=None,
    )


def test_the_directory_is_the_setting_else_one_in_the_temp_dir(tmp_path: Path) -> None:
    assert default_postmortem_dir({POSTMORTEM_DIR_ENV: str(tmp_path)}) == tmp_path
    assert default_postmortem_dir({POSTMORTEM_DIR_ENV: "  "}) == (
        Path(tempfile.gettempdir()) / "raylens-postmortems"
    )


def test_a_hostile_node_id_cannot_steer_the_file_name(tmp_path: Path) -> None:
    writer = PostMortemWriter(tmp_path / "made")
    path = writer.write(_document("../../etc/passwd\n\x1b[2J" + "b" * 40))
    assert path is not None and path.parent == tmp_path / "made"
    assert re.fullmatch(
        r"oom-20231114T221320-kernel-etcpasswd[0-9A-Za-z]{7}-\d+-1\.json", path.name
    )
    assert json.loads(path.read_text())["node_id"].startswith("../../etc/passwd\\x0a\\x1b")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_a_rewrite_replaces_the_file_whole(tmp_path: Path) -> None:
    writer = PostMortemWriter(tmp_path)
    path = writer.write(_document())
    assert path is not None
    document = _document()
    document["phase"] = "train"
    assert writer.write(document, path) == path
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

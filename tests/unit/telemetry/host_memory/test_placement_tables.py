"""A placement group table whose bundle map has the wrong shape is named in the warning."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from raylens.lens import reset_warn_once
from raylens.telemetry.host_memory._placement import PlacementRegistry
from raylens.telemetry.names import LOGGER_NAME


class _OneTableCluster:
    def __init__(self, table: dict[str, Any]) -> None:
        self.table = table

    def is_initialized(self) -> bool:
        return True

    def nodes(self) -> list[dict[str, Any]]:
        return []

    def placement_group_table(self, placement_group: Any) -> dict[str, Any]:
        return self.table


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    reset_warn_once()


def test_a_bundle_map_that_is_not_a_mapping_is_named_and_leaves_the_entry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = PlacementRegistry()
    registry.register_nodes("policy", ["node-a"])
    cluster = _OneTableCluster({"state": "CREATED", "bundles_to_node_id": ["node-b"]})
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        registry.register_placement("policy", [(object(), 0)], cluster)
    assert registry.nodes == {"policy": frozenset({"node-a"})}
    assert "bundles_to_node_id is a list, not a mapping" in caplog.text


def test_a_well_formed_table_places_the_group() -> None:
    registry = PlacementRegistry()
    cluster = _OneTableCluster({"state": "CREATED", "bundles_to_node_id": {0: "node-b"}})
    registry.register_placement("policy", [(object(), 0)], cluster)
    assert registry.nodes == {"policy": frozenset({"node-b"})}

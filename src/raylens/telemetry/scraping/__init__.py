"""Scraping raylets: the engine, the protocol the monitor asks of engines, and the helper's channel.

This package stays light on purpose: it imports neither :mod:`raylens.lens` nor
OpenTelemetry, because the scrape helper process runs from it
(:mod:`raylens.telemetry.scraping._helper_program`) and starts in a fraction of the time
an interpreter with the SDK loaded would take. The import contract ``light-helper`` in
``pyproject.toml`` keeps it so.
"""

from __future__ import annotations

from raylens.telemetry.scraping._channel import (
    MAX_MESSAGE_BYTES,
    ChannelBroken,
    DriverChannel,
    encode,
    read_message,
    write_message,
)
from raylens.telemetry.scraping._engine import (
    BATCH_SLACK_S,
    MAX_BODY_BYTES,
    MAX_CONCURRENCY,
    NOT_ASKED_IN_FLIGHT,
    AsyncScrapeEngine,
    Job,
    Outcome,
    ScrapeLimits,
    fetch_once,
    outcome_of_payload,
)
from raylens.telemetry.scraping._helper_program import leave_out_known_groups
from raylens.telemetry.scraping._protocol import PrestartingEngine, ScrapeEngine, TrustingEngine
from raylens.telemetry.scraping._wire import (
    GROUPS_UNCHANGED,
    MESSAGE_FIELDS,
    READY_MESSAGE,
    ROW_FIELDS,
    HeldFigures,
    MalformedRows,
    Row,
    decode_outcomes,
    encode_outcomes,
    is_result_of,
    result_message,
    scrape_message,
    trust_message,
)

__all__ = [
    "BATCH_SLACK_S",
    "GROUPS_UNCHANGED",
    "MAX_BODY_BYTES",
    "MAX_CONCURRENCY",
    "MAX_MESSAGE_BYTES",
    "MESSAGE_FIELDS",
    "NOT_ASKED_IN_FLIGHT",
    "READY_MESSAGE",
    "ROW_FIELDS",
    "AsyncScrapeEngine",
    "ChannelBroken",
    "DriverChannel",
    "HeldFigures",
    "Job",
    "MalformedRows",
    "Outcome",
    "PrestartingEngine",
    "Row",
    "ScrapeEngine",
    "ScrapeLimits",
    "TrustingEngine",
    "decode_outcomes",
    "encode",
    "encode_outcomes",
    "fetch_once",
    "is_result_of",
    "leave_out_known_groups",
    "outcome_of_payload",
    "read_message",
    "result_message",
    "scrape_message",
    "trust_message",
    "write_message",
]

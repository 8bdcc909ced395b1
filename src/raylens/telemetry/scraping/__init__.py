"""Scraping raylets: the engine, the protocol the monitor asks of engines, and the helper's channel.

This package stays light on purpose: it imports neither :mod:`raylens.lens` nor
OpenTelemetry, because the scrape helper process runs from it
(:mod:`raylens.telemetry.scraping._helper_program`) and starts in a fraction of the time
an interpreter with the SDK loaded would take. The import contract ``light-helper`` in
``pyproject.toml`` keeps it so. This face names what the monitor's engines use; the
helper's side of the wire (encoding outcomes, the message framing, the field lists) is
imported from the module that defines it.
"""

from __future__ import annotations

from raylens.telemetry.scraping._channel import ChannelBroken, DriverChannel
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
from raylens.telemetry.scraping._protocol import PrestartingEngine, ScrapeEngine, TrustingEngine
from raylens.telemetry.scraping._wire import (
    READY_MESSAGE,
    WIRE_VERSION,
    HeldFigures,
    MalformedRows,
    Row,
    decode_outcomes,
    encode_outcomes,
    is_ready_message,
    is_result_of,
    scrape_message,
    trust_message,
)

__all__ = [
    "BATCH_SLACK_S",
    "MAX_BODY_BYTES",
    "MAX_CONCURRENCY",
    "NOT_ASKED_IN_FLIGHT",
    "READY_MESSAGE",
    "WIRE_VERSION",
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
    "encode_outcomes",
    "fetch_once",
    "is_ready_message",
    "is_result_of",
    "outcome_of_payload",
    "scrape_message",
    "trust_message",
]

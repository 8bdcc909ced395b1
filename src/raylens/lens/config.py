"""What lens should export, and where: :class:`TelemetryConfig`, read from the environment.

Invariants a maintainer must keep:

- every value is checked here, up front, with an error naming the variable, the value and
  what is allowed, so that nothing fails later on every export;
- a variable set to an empty or blank value reads as unset (OpenTelemetry's rule for its
  own variables);
- the export interval stays within what a Python thread can wait for at once
  (:data:`MAX_EXPORT_INTERVAL_MS`), or the SDK's export thread dies.

The variables, their defaults and precedence: the README's *Configuration*.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from raylens.safe_text import encodable

EXPORTERS = ("console", "otlp", "prometheus", "none")

DEFAULT_SERVICE_NAME = "raylens"
DEFAULT_PROMETHEUS_ADDR = "127.0.0.1:9464"
DEFAULT_OTLP_ENDPOINT = "http://localhost:4318"
DEFAULT_EXPORT_INTERVAL_MS = 60_000
# The SDK's export thread waits for the interval in one call, and a wait longer than
# threading.TIMEOUT_MAX raises OverflowError inside that thread, which then dies.
# Whole seconds, so that the division back to seconds cannot round above the limit.
MAX_EXPORT_INTERVAL_MS = int(threading.TIMEOUT_MAX) * 1000

WORKER_GROUP_ATTRIBUTE = "rl.worker_group"
WORKER_GROUP_VARIABLES = ("RAYLENS_WORKER_GROUP", "NRL_WORKER_GROUP")

_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


def _parse_switch(variable: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{variable}={raw!r} is not a switch; allowed: on, off, 1, 0, true, false, yes, no"
    )


def parse_host_port(value: str, *, source: str = "address") -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` for IPv6) and check the port; ValueError names ``source``."""
    raw = value.strip()
    host, sep, port_text = raw.rpartition(":")
    # isdigit() alone admits digits such as '²' that int() refuses.
    if not sep or not host or not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"{source}={value!r} is not host:port (for example 127.0.0.1:9464)")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"{source}={value!r} has port {port}; allowed ports are 0 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


@dataclass(frozen=True)
class TelemetryConfig:
    """Everything :func:`raylens.lens.init_telemetry` needs to know."""

    enabled: bool = True
    exporter: str = "none"
    service_name: str = DEFAULT_SERVICE_NAME
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    otlp_endpoint: str = DEFAULT_OTLP_ENDPOINT + "/v1/metrics"
    prometheus_addr: str = DEFAULT_PROMETHEUS_ADDR
    export_interval_ms: int = DEFAULT_EXPORT_INTERVAL_MS

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise ValueError(
                f"exporter {self.exporter!r} is not known; allowed: {', '.join(EXPORTERS)}"
            )
        if isinstance(self.export_interval_ms, bool) or not isinstance(
            self.export_interval_ms, int
        ):
            raise ValueError(f"export_interval_ms must be an int, got {self.export_interval_ms!r}")
        if not 1 <= self.export_interval_ms <= MAX_EXPORT_INTERVAL_MS:
            raise ValueError(
                f"export_interval_ms={self.export_interval_ms} is out of range; allowed: "
                f"1 to {MAX_EXPORT_INTERVAL_MS} milliseconds"
            )
        parse_host_port(self.prometheus_addr, source="prometheus_addr")

    @property
    def prometheus_host_port(self) -> tuple[str, int]:
        return parse_host_port(self.prometheus_addr, source="prometheus_addr")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TelemetryConfig:
        """Read the configuration from ``environ`` (default ``os.environ``).

        Raises ValueError naming the variable, its value and what is allowed.
        """
        raw_env = os.environ if environ is None else environ
        # Blank values read as unset, as OpenTelemetry defines it for its variables.
        env = {name: value for name, value in raw_env.items() if value.strip()}

        enabled = _parse_switch("RAYLENS_TELEMETRY", env.get("RAYLENS_TELEMETRY", "on"))

        metrics_endpoint = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip()
        base_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if metrics_endpoint:
            otlp_endpoint = metrics_endpoint
        elif base_endpoint:
            otlp_endpoint = base_endpoint.rstrip("/") + "/v1/metrics"
        else:
            otlp_endpoint = DEFAULT_OTLP_ENDPOINT + "/v1/metrics"
        for variable, url in (
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", metrics_endpoint),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", base_endpoint),
        ):
            if url:
                check_http_url(url, source=variable)

        default_exporter = "otlp" if (metrics_endpoint or base_endpoint) else "none"
        exporter = env.get("RAYLENS_EXPORTER", default_exporter).strip().lower() or default_exporter
        if exporter not in EXPORTERS:
            raise ValueError(
                f"RAYLENS_EXPORTER={env.get('RAYLENS_EXPORTER')!r} is not known; "
                f"allowed: {', '.join(EXPORTERS)}"
            )

        prometheus_addr = env.get("RAYLENS_PROMETHEUS_ADDR", DEFAULT_PROMETHEUS_ADDR)
        parse_host_port(prometheus_addr, source="RAYLENS_PROMETHEUS_ADDR")

        interval_raw = env.get("OTEL_METRIC_EXPORT_INTERVAL", str(DEFAULT_EXPORT_INTERVAL_MS))
        interval = parse_interval_ms(interval_raw, source="OTEL_METRIC_EXPORT_INTERVAL")

        resource_attributes = _parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
        for variable in WORKER_GROUP_VARIABLES:
            group = env.get(variable, "").strip()
            if group:
                resource_attributes[WORKER_GROUP_ATTRIBUTE] = encodable(group)
                break
        # OTEL_SERVICE_NAME wins over a service.name among the resource attributes.
        service_name = encodable(
            env.get("OTEL_SERVICE_NAME", "").strip()
            or resource_attributes.get("service.name", "")
            or DEFAULT_SERVICE_NAME
        )

        return cls(
            enabled=enabled,
            exporter=exporter,
            service_name=service_name,
            resource_attributes=resource_attributes,
            otlp_endpoint=otlp_endpoint,
            prometheus_addr=prometheus_addr.strip(),
            export_interval_ms=interval,
        )


def _parse_resource_attributes(raw: str) -> dict[str, str]:
    """``key1=value1,key2=value2`` with percent-encoded values, as the SDK documents it."""
    from urllib.parse import unquote

    attributes: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"OTEL_RESOURCE_ATTRIBUTES={raw!r} has {item!r}, which is not key=value"
            )
        attributes[encodable(key.strip())] = encodable(unquote(value.strip()))
    return attributes


def parse_interval_ms(raw: str, *, source: str) -> int:
    """A whole number of milliseconds from 1 to :data:`MAX_EXPORT_INTERVAL_MS`.

    Raises ValueError naming ``source``, the value and the allowed range.
    """
    text = raw.strip()
    interval = int(text) if text.isascii() and text.isdigit() else 0
    if not 1 <= interval <= MAX_EXPORT_INTERVAL_MS:
        raise ValueError(
            f"{source}={raw!r} is not a positive whole number of milliseconds in range; "
            f"allowed: 1 to {MAX_EXPORT_INTERVAL_MS}"
        )
    return interval


def check_http_url(url: str, *, source: str) -> None:
    """Refuse ``url`` unless it is an absolute http(s) URL with a host and a valid port.

    Uses :func:`urllib.parse.urlsplit` (a linear scan, no regular expression). Control
    characters and spaces are refused first, since ``urlsplit`` silently drops some.
    Raises ValueError naming ``source`` and the URL.
    """
    problem = ""
    if any(ch <= " " or ch == "\x7f" for ch in url):
        problem = "holds a space or control character"
    else:
        try:
            parts = urlsplit(url)
            port = parts.port  # ValueError for a port that is not a number in 0-65535
        except ValueError as error:
            problem = f"cannot be parsed ({error})"
        else:
            if parts.scheme not in ("http", "https"):
                problem = "must start with http:// or https://"
            elif not parts.hostname:
                problem = "has no host"
            elif port == 0:
                problem = "has port 0"
    if problem:
        raise ValueError(
            f"{source}={url!r} {problem}; allowed: an http:// or https:// URL such as "
            "http://collector:4318"
        )

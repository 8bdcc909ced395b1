"""Where the Prometheus is and how to ask it: one validated value object.

Read from ``RAYLENS_PROMETHEUS_*`` by :meth:`PrometheusSettings.from_env`; every bad
value raises a ValueError naming the variable, the value (printable, and never a
secret's) and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import urllib.parse
from collections.abc import Mapping

from raylens.safe_text import printable
from raylens.telemetry.prometheus_source._queries import DEFAULT_JOB, check_job
from raylens.validation import positive_seconds

__all__ = [
    "CA_FILE_ENV",
    "JOB_ENV",
    "PASSWORD_ENV",
    "SCRAPE_INTERVAL_ENV",
    "TOKEN_ENV",
    "URL_ENV",
    "USER_ENV",
    "PrometheusSettings",
    "check_url",
]

URL_ENV = "RAYLENS_PROMETHEUS_URL"
USER_ENV = "RAYLENS_PROMETHEUS_USER"
PASSWORD_ENV = "RAYLENS_PROMETHEUS_PASSWORD"
TOKEN_ENV = "RAYLENS_PROMETHEUS_TOKEN"
CA_FILE_ENV = "RAYLENS_PROMETHEUS_CA_FILE"
JOB_ENV = "RAYLENS_PROMETHEUS_JOB"
SCRAPE_INTERVAL_ENV = "RAYLENS_PROMETHEUS_SCRAPE_INTERVAL"

#: Prometheus' own default scrape interval.
DEFAULT_SCRAPE_INTERVAL_S = 15.0
#: One answer's body at most: 10,000 nodes of four groups answer about 8 MB for the largest query.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
#: Series kept from one answer at most (a node's groups are bounded on the node too).
DEFAULT_MAX_SERIES = 400_000
DEFAULT_TIMEOUT_S = 10.0


def check_url(text: str, *, source: str = "--prometheus") -> str:
    """``text`` as the base URL of a Prometheus HTTP API (http or https, a host), no trailing /.

    Credentials in the URL are refused (they would show in every error line); give them
    through the environment instead.
    """
    shown = printable(repr(text))[:200]
    url = text.strip().rstrip("/") if isinstance(text, str) else ""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{source} {shown} is not a Prometheus URL: give http(s)://HOST[:PORT][/PATH]"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"{source} holds credentials: give them in {USER_ENV}/{PASSWORD_ENV} or {TOKEN_ENV}"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"{source} {shown} has a query or fragment; give the API's base URL")
    del port  # validated by reading it
    return url


@dataclasses.dataclass(frozen=True)
class PrometheusSettings:
    """How to reach one Prometheus (or anything that speaks its HTTP API).

    ``scrape_interval_s`` is how often it scrapes the nodes: a node whose series are
    older than twice that is failing. TLS certificates are always verified, against the
    system's authorities or ``ca_file``. ``user``/``password`` (basic) and ``token``
    (bearer) are exclusive.
    """

    url: str
    job: str = DEFAULT_JOB
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    user: str | None = dataclasses.field(default=None, repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)
    token: str | None = dataclasses.field(default=None, repr=False)
    ca_file: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_series: int = DEFAULT_MAX_SERIES

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", check_url(self.url, source="prometheus_url"))
        check_job(self.job)
        positive_seconds("scrape_interval_s", self.scrape_interval_s, maximum=3600.0)
        positive_seconds("timeout_s", self.timeout_s, maximum=600.0)
        if self.token is not None and (self.user is not None or self.password is not None):
            raise ValueError(f"give either {TOKEN_ENV} or {USER_ENV}/{PASSWORD_ENV}, not both")
        if (self.user is None) != (self.password is None):
            raise ValueError(f"{USER_ENV} and {PASSWORD_ENV} go together; one is missing")
        for name in ("max_body_bytes", "max_series"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")

    @property
    def query_url(self) -> str:
        """The instant-query endpoint."""
        return f"{self.url}/api/v1/query"

    @classmethod
    def from_env(
        cls, url: str | None = None, environ: Mapping[str, str] | None = None
    ) -> PrometheusSettings:
        """Settings from ``RAYLENS_PROMETHEUS_*``; ``url`` (a flag's) wins over the variable."""
        env = os.environ if environ is None else environ

        def text(name: str) -> str | None:
            value = env.get(name)
            return value if value else None

        given = url if url is not None else text(URL_ENV)
        if given is None:
            raise ValueError(f"no Prometheus URL: give --prometheus URL or set {URL_ENV}")
        interval = text(SCRAPE_INTERVAL_ENV)
        seconds = DEFAULT_SCRAPE_INTERVAL_S
        if interval is not None:
            try:
                seconds = float(interval)
            except ValueError:
                seconds = math.nan
            if not math.isfinite(seconds) or not 0 < seconds <= 3600:
                raise ValueError(
                    f"{SCRAPE_INTERVAL_ENV}={printable(repr(interval))[:60]} must be a number "
                    "of seconds above 0 and at most 3600"
                )
        job = text(JOB_ENV) or DEFAULT_JOB
        try:
            check_job(job)
        except ValueError as error:
            raise ValueError(f"{JOB_ENV}: {error}") from None
        return cls(
            url=check_url(given, source="--prometheus" if url is not None else URL_ENV),
            job=job,
            scrape_interval_s=seconds,
            user=text(USER_ENV),
            password=text(PASSWORD_ENV),
            token=text(TOKEN_ENV),
            ca_file=text(CA_FILE_ENV),
        )

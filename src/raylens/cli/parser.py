"""The ``raylens`` command's flags, and the one validator each kind of flag value goes through.

Every bad value is refused with one line on stderr naming the flag and what is
allowed, and exit status 2, before anything starts.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

import raylens
from raylens.lens.config import EXPORTERS
from raylens.safe_text import printable


class CliError(Exception):
    """A problem the user can fix: printed as one line, exit status 2."""

    exit_code = 2


# --------------------------------------------------------------------------- flags


# The shortest wait between two samples: below it a command would do nothing but sample.
MIN_INTERVAL_S = 0.05
# The shortest deadline or run time a flag may give.
MIN_SECONDS = 0.001
# The longest interval, deadline or run time a flag may give: 365 days. A longer one
# is a typo, and every timer this waits on holds it.
MAX_SECONDS = 365 * 24 * 3600


def seconds(minimum: float) -> Callable[[str], float]:
    """The one validator of every flag given in seconds: at least ``minimum``, at most 365 days."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds, got {text!r}"
            ) from None
        if not math.isfinite(value) or not minimum <= value <= MAX_SECONDS:
            raise argparse.ArgumentTypeError(
                f"must be at least {minimum:g} s and at most {MAX_SECONDS} s (365 days), "
                f"got {text!r}"
            )
        return value

    return parse


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text!r}")
        return value

    return parse


# What --address (or RAY_ADDRESS) may be, said in every refusal of one.
ADDRESS_FORMS = (
    "give the cluster's GCS address as HOST:PORT (port 6379 unless the head was started "
    "with another --port), or auto; ray://HOST:PORT is the only scheme taken, to say "
    "which address to pass instead"
)


def cluster_address(text: str, *, source: str | None = None) -> str:
    """Check a Ray cluster address: ``auto``, ``HOST:PORT`` or ``ray://...``; returns it stripped.

    Anything else is refused before Ray sees it: ``ray.init`` imports the module a
    scheme names (``this://`` prints the Zen of Python), and an empty address attaches
    to whatever cluster runs on this machine. The ValueError names the value, and
    ``source`` (an environment variable, say) when given.
    """
    address = text.strip()
    shown = printable(repr(text)) if source is None else f"{source}={printable(repr(text))}"
    if not address:
        raise ValueError(f"{shown} is empty: {ADDRESS_FORMS}")
    if address == "auto" or address.startswith("ray://"):
        return address
    if "://" in address:
        scheme = address.split("://", 1)[0]
        raise ValueError(
            f"{shown} has the scheme {printable(repr(scheme))}, which Ray does not "
            f"connect with here: {ADDRESS_FORMS}"
        )
    try:
        split_host_port(address)
    except ValueError as error:
        raise ValueError(f"{shown} {error}: {ADDRESS_FORMS}") from None
    return address


def split_host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) as ``(host, port)``; ValueError says what is wrong."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ValueError("is not HOST:PORT")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise ValueError("has no port from 1 to 65535 after its last ':'")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host.isprintable() or any(c.isspace() for c in host):
        raise ValueError("has spaces or control characters in its host")
    return host, int(port_text)


def _address_flag(text: str) -> str:
    try:
        return cluster_address(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class _Parser(argparse.ArgumentParser):
    """An argument parser whose every refusal is one line: the error, and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2,
            printable(f"{self.prog}: error: {message} (see '{self.prog} --help')") + "\n",
        )


def _add_verbose(parser: argparse.ArgumentParser, *, default: object) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="log raylens' warnings (a node that cannot be scraped...) to stderr",
    )


def _add_common(parser: argparse.ArgumentParser, *, interval: float, duration: bool = True) -> None:
    # Also after the command (raylens simulate -v); left unset there, the main flag's value stands.
    _add_verbose(parser, default=argparse.SUPPRESS)
    if duration:
        parser.add_argument(
            "--duration",
            type=seconds(MIN_SECONDS),
            default=None,
            help="stop after this many seconds (default: run until Ctrl-C)",
        )
    parser.add_argument(
        "--interval",
        type=seconds(MIN_INTERVAL_S),
        default=interval,
        help=f"seconds between samples (default {interval:g})",
    )
    parser.add_argument(
        "--exporter",
        choices=EXPORTERS,
        default=None,
        help="OpenTelemetry exporter for this run (default: RAYLENS_EXPORTER, else none)",
    )


def _add_script_flags(
    parser: argparse.ArgumentParser, *, once_help: str = "take one sample, print it, exit"
) -> None:
    parser.add_argument("--once", action="store_true", help=once_help)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per sample instead of a table"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="raylens",
        description="See where host memory goes on a Ray cluster, and export it via OpenTelemetry.",
    )
    parser.add_argument("--version", action="version", version=f"raylens {raylens.__version__}")
    _add_verbose(parser, default=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="start a local multi-node Ray cluster with two worker groups and watch its memory",
    )
    demo.add_argument("--nodes", type=_count(2), default=3, help="Ray nodes to start (default 3)")
    _add_common(demo, interval=2.0)
    _add_record_flag(demo)

    watch = commands.add_parser("watch", help="watch the memory of a running Ray cluster")
    watch.add_argument(
        "--address",
        type=_address_flag,
        default=None,
        help="the cluster's GCS, HOST:PORT (default: RAY_ADDRESS, else auto)",
    )
    watch.add_argument(
        "--prometheus",
        nargs="?",
        const="",
        default=None,
        metavar="URL",
        help="read the figures from the Prometheus that scrapes the cluster, at URL "
        "(default: RAYLENS_PROMETHEUS_URL), instead of from every node",
    )
    _add_common(watch, interval=5.0)
    _add_script_flags(watch)
    watch.add_argument(
        "--give-up",
        type=seconds(1.0),
        default=30.0,
        help="exit with status 2 once the cluster has not answered for this many seconds "
        "(default 30)",
    )
    _add_record_flag(watch)

    simulate = commands.add_parser(
        "simulate", help="watch a simulated cluster of fake raylets (no Ray needed)"
    )
    simulate.add_argument("--nodes", type=_count(1), default=8, help="simulated nodes (default 8)")
    simulate.add_argument(
        "--hung", type=_count(0), default=0, help="how many nodes never answer (default 0)"
    )
    simulate.add_argument(
        "--scrape-timeout",
        type=seconds(MIN_SECONDS),
        default=None,
        help="deadline for one node's scrape (default: the interval, raised by 5 ms per node, "
        "at most 5 s)",
    )
    _add_common(simulate, interval=1.0)
    _add_script_flags(simulate)
    _add_record_flag(simulate)

    profile = commands.add_parser(
        "profile", help="run a command and sample its process tree's memory while it runs"
    )
    _add_common(profile, interval=1.0, duration=False)
    profile.add_argument(
        "--pss-interval",
        type=seconds(MIN_INTERVAL_S),
        default=None,
        help="read PSS (costly for big processes) at most this often (default: every sample); "
        "a PSS is shown with its age, and once older than this plus one --interval it is "
        "shown as '- stale' (null, with pss_stale true, in --json)",
    )
    _add_script_flags(
        profile,
        once_help="print one sample, taken after one interval, then wait for the command "
        "to end without printing more",
    )
    profile.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")

    plot = commands.add_parser(
        "plot",
        help="draw a recorded run (watch --record) or an OOM post-mortem as a PNG "
        "(needs raylens[plot])",
    )
    plot.add_argument("file", metavar="FILE", help="a record or an OOM post-mortem JSON file")
    plot.add_argument("-o", "--output", default=None, help="the PNG to write (default: FILE.png)")
    return parser


def _add_record_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        metavar="FILE",
        default=None,
        help="append each sample's per-node and per-group memory, phases and kills to FILE "
        "(JSON lines, kept under 32 MiB by moving a full file to FILE.1); "
        "draw it with 'raylens plot FILE'",
    )

"""Per-group series as a node's Ray metrics agent serves them, for simulated raylets.

A sampler actor sets Ray gauges; the node's agent serves them with Ray's ``ray_``
prefix and the labels it adds (component, node address, session, version, worker
id, OpenTelemetry scope). :func:`render_group_series` writes the same lines, so the
simulated cluster exercises the very parser a real cluster does.
"""

from __future__ import annotations

from collections.abc import Iterable

from raylens.telemetry.raylet_payload import (
    GROUP_LABEL,
    MEMORY_TYPE_LABEL,
    NODE_SERIES,
    RAY_GROUP_GROWTH,
    RAY_GROUP_MEMORY,
    RAY_GROUP_PROCESSES,
    RAY_GROUP_PSS_AGE,
    RAY_SAMPLER_SAMPLED_AT,
    RAY_WORKER_ID_LABEL,
    SAMPLER_LABEL,
    STARTED_BY_LABEL,
    GroupFigure,
    NodeFigures,
)

__all__ = ["render_group_series"]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(worker_id: str, address: str, extra: dict[str, str]) -> str:
    labels = {
        "Component": "core_worker",
        "NodeAddress": address,
        "SessionName": "session_simulated",
        "Version": "2.60.0",
        RAY_WORKER_ID_LABEL: worker_id,
        "otel_scope_name": "ray._private.telemetry.open_telemetry_metric_recorder",
        "otel_scope_schema_url": "",
        "otel_scope_version": "",
        **extra,
    }
    return ",".join(f'{key}="{_escape(labels[key])}"' for key in sorted(labels))


def render_group_series(
    figures: Iterable[GroupFigure],
    *,
    sampled_at: float,
    worker_id: str = "0" * 56,
    address: str = "127.0.0.1",
    node: NodeFigures | None = None,
) -> bytes:
    """Exposition lines for one sampler's latest reading, in the shape Ray 2.60 serves them.

    ``node`` adds the node's own figures; one that is None is served as NaN, as a sampler
    sets it.
    """
    lines = [f"# TYPE {RAY_SAMPLER_SAMPLED_AT} gauge"]
    lines.append(f"{RAY_SAMPLER_SAMPLED_AT}{{{_labels(worker_id, address, {})}}} {sampled_at!r}")
    if node is not None:
        plain = _labels(worker_id, address, {})
        values = (
            node.used,
            node.growth,
            node.outside_growth,
            1.0 if node.growing else 0.0,
            node.limit,
            node.time_to_limit,
        )
        for name, value in zip(NODE_SERIES, values):
            shown = "NaN" if value is None else repr(float(value))
            lines.append(f"{name}{{{plain}}} {shown}")
        identity = _labels(
            worker_id, address, {SAMPLER_LABEL: node.sampler, STARTED_BY_LABEL: node.started_by}
        )
        lines.append(f"{NODE_SERIES[-1]}{{{identity}}} {float(node.window_s)!r}")
    memory, processes = (
        [f"# TYPE {RAY_GROUP_MEMORY} gauge"],
        [f"# TYPE {RAY_GROUP_PROCESSES} gauge"],
    )
    for figure in figures:
        for kind, value in (("rss", figure.rss_bytes), ("pss", figure.pss_bytes)):
            if value is not None:
                labels = _labels(
                    worker_id, address, {GROUP_LABEL: figure.group, MEMORY_TYPE_LABEL: kind}
                )
                memory.append(f"{RAY_GROUP_MEMORY}{{{labels}}} {float(value):e}")
        if figure.growth is not None:
            labels = _labels(worker_id, address, {GROUP_LABEL: figure.group})
            processes.append(f"{RAY_GROUP_GROWTH}{{{labels}}} {float(figure.growth):e}")
        if figure.pss_age_s is not None:
            labels = _labels(worker_id, address, {GROUP_LABEL: figure.group})
            processes.append(f"{RAY_GROUP_PSS_AGE}{{{labels}}} {float(figure.pss_age_s)!r}")
        if figure.process_count is not None:
            labels = _labels(worker_id, address, {GROUP_LABEL: figure.group})
            processes.append(f"{RAY_GROUP_PROCESSES}{{{labels}}} {float(figure.process_count):e}")
    return ("\n".join(lines + memory + processes) + "\n").encode("utf-8")

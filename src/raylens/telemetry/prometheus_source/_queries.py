"""The fixed set of instant queries one cycle sends, whatever the number of nodes.

Each query aggregates on the server down to the labels raylens uses (the target's
``instance``, the sampler's ``WorkerId``, the group's name...), so a response carries
one short series per node or per group rather than every label Ray's agent adds. A node
is a scrape target: Prometheus' ``instance`` label, the address Ray's service-discovery
file lists for the node's metrics agent.
"""

from __future__ import annotations

import enum
import re

from raylens.telemetry.raylet_payload import (
    GROUP_LABEL,
    MEMORY_TYPE_LABEL,
    NODE_SERIES,
    RAY_GROUP_GROWTH,
    RAY_GROUP_MEMORY,
    RAY_GROUP_PROCESSES,
    RAY_NODE_MEM_TOTAL,
    RAY_NODE_MEM_USED,
    RAY_NODE_OOM_KILLS,
    RAY_SAMPLER_SAMPLED_AT,
    RAY_WORKER_EVICTIONS,
    RAY_WORKER_ID_LABEL,
    SAMPLER_LABEL,
    STARTED_BY_LABEL,
)

__all__ = ["DEFAULT_JOB", "INSTANCE_LABEL", "Query", "check_job", "query_text"]

#: The label Prometheus gives every series of a target: the address it scraped.
INSTANCE_LABEL = "instance"
#: The job Ray's own Prometheus set-up gives the targets of its service-discovery file.
DEFAULT_JOB = "ray"
# A job name goes into every query inside double quotes: only plain characters are taken,
# so nothing in it can close the quote or start another matcher.
_JOB_CHARS = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")


def check_job(job: str) -> str:
    """``job`` if it may name a Prometheus job here; ValueError naming it and what is allowed."""
    if not isinstance(job, str) or _JOB_CHARS.fullmatch(job) is None:
        raise ValueError(
            f"Prometheus job {job!r} is not allowed: use 1 to 200 letters, digits and _ . : / -"
        )
    return job


class Query(enum.Enum):
    """Every query of a cycle; its value is the PromQL with ``{job}`` for the job matcher."""

    #: Scrape health of every target of the job.
    UP = 'up{{job="{job}"}}'
    #: When each node's raylet series was last scraped: its age, for staleness.
    FRESH = f'timestamp({RAY_NODE_MEM_USED}{{{{job="{{job}}"}}}})'
    #: Node memory as Ray's memory monitor counts it, and its total.
    NODE_USED = f'max by ({INSTANCE_LABEL}, ip) ({RAY_NODE_MEM_USED}{{{{job="{{job}}"}}}})'
    NODE_TOTAL = f'max by ({INSTANCE_LABEL}) ({RAY_NODE_MEM_TOTAL}{{{{job="{{job}}"}}}})'
    #: Each sampler's stamp: which sampler on a node is the freshest.
    SAMPLED_AT = (
        f"max by ({INSTANCE_LABEL}, {RAY_WORKER_ID_LABEL}) "
        f'({RAY_SAMPLER_SAMPLED_AT}{{{{job="{{job}}"}}}})'
    )
    #: Group memory (RSS and PSS), processes and growth, per sampler and group.
    GROUP_MEMORY = (
        f"max by ({INSTANCE_LABEL}, {RAY_WORKER_ID_LABEL}, {GROUP_LABEL}, {MEMORY_TYPE_LABEL}) "
        f'({RAY_GROUP_MEMORY}{{{{job="{{job}}"}}}})'
    )
    GROUP_PROCESSES = (
        f"max by ({INSTANCE_LABEL}, {RAY_WORKER_ID_LABEL}, {GROUP_LABEL}) "
        f'({RAY_GROUP_PROCESSES}{{{{job="{{job}}"}}}})'
    )
    GROUP_GROWTH = (
        f"max by ({INSTANCE_LABEL}, {RAY_WORKER_ID_LABEL}, {GROUP_LABEL}) "
        f'({RAY_GROUP_GROWTH}{{{{job="{{job}}"}}}})'
    )
    #: The node's own figures (used, growth, outside growth, growing, limit, time to limit).
    NODE_FIGURES = (
        f"max by (__name__, {INSTANCE_LABEL}, {RAY_WORKER_ID_LABEL}) "
        f'({{{{__name__=~"{"|".join(NODE_SERIES[:-1])}",job="{{job}}"}}}})'
    )
    #: The sampler's window, labelled with its identity.
    WINDOW = (
        f"max by ({INSTANCE_LABEL}, {RAY_WORKER_ID_LABEL}, {SAMPLER_LABEL}, {STARTED_BY_LABEL}) "
        f'({NODE_SERIES[-1]}{{{{job="{{job}}"}}}})'
    )
    #: Ray's memory monitor's kills, the raylet's own counter only, per victim name.
    EVICTIONS = (
        f"sum by ({INSTANCE_LABEL}, Name) "
        f'({RAY_WORKER_EVICTIONS}{{{{job="{{job}}",Component="raylet",{RAY_WORKER_ID_LABEL}=""}}}})'
    )
    #: The kernel's OOM kills as the node's samplers counted them.
    KERNEL_KILLS = f'max by ({INSTANCE_LABEL}) ({RAY_NODE_OOM_KILLS}{{{{job="{{job}}"}}}})'


def query_text(query: Query, job: str = DEFAULT_JOB) -> str:
    """The PromQL of ``query`` for the targets of ``job`` (checked by :func:`check_job`)."""
    return query.value.format(job=check_job(job))

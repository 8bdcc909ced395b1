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
    RAY_GROUP_PSS_AGE,
    RAY_NODE_MEM_TOTAL,
    RAY_NODE_MEM_USED,
    RAY_NODE_OOM_KILLS,
    RAY_SAMPLER_SAMPLED_AT,
    RAY_WORKER_EVICTIONS,
    RAY_WORKER_ID_LABEL,
    SAMPLER_LABEL,
    STARTED_BY_LABEL,
)

__all__ = [
    "DEFAULT_JOB",
    "GROUP_KINDS",
    "INSTANCE_LABEL",
    "KIND_LABEL",
    "NODE_KINDS",
    "Query",
    "check_job",
    "query_text",
]

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


# The samplers' stamp, and the filter keeping only the freshest sampler of each node: Ray
# serves a replaced sampler's series until they age out, each with its own WorkerId.
_STAMP = f'{RAY_SAMPLER_SAMPLED_AT}{{{{job="{{job}}"}}}}'
_FRESHEST = (
    f"on ({INSTANCE_LABEL}, {RAY_WORKER_ID_LABEL}) "
    f"({_STAMP} == on ({INSTANCE_LABEL}) group_left () max by ({INSTANCE_LABEL}) ({_STAMP}))"
)
#: The label a figure's kind is put in, by ``label_replace``: one letter of its series name.
KIND_LABEL = "k"
_GROUP_PREFIX = "ray_raylens_worker_group_"
_NODE_PREFIX = "ray_raylens_node_memory_"
_GROUP_NAMES = (RAY_GROUP_MEMORY, RAY_GROUP_PROCESSES, RAY_GROUP_GROWTH, RAY_GROUP_PSS_AGE)
# Group series: memory_bytes, processes, memory_growth_..., pss_age_... -> by, pr, gr, ps.
_GROUP_KIND_PATTERN = f"{_GROUP_PREFIX}(?:memory_)?(..).*"
#: The kind letters of group memory, processes, growth and PSS age.
GROUP_KINDS = ("by", "pr", "gr", "ps")
_GROWING = NODE_SERIES[3]
_NODE_NAMES = tuple(name for name in NODE_SERIES[:-1] if name != _GROWING)
# Node series: used_bytes, growth_..., outside_groups_..., limit_bytes, time_to_limit_...
_NODE_KIND_PATTERN = f"{_NODE_PREFIX}(.).*"
#: The kind letter of the node's used memory, growth, outside growth, limit, time to limit.
NODE_KINDS = tuple(name[len(_NODE_PREFIX)] for name in _NODE_NAMES)
assert (
    len(set(NODE_KINDS)) == len(NODE_KINDS)
    and tuple(name[len(_GROUP_PREFIX) :].removeprefix("memory_")[:2] for name in _GROUP_NAMES)
    == GROUP_KINDS
)


# Group memory is RSS or PSS; the other group series have no memory type.
_RSS_OR_NONE = f',{MEMORY_TYPE_LABEL}=~"|rss"'


def _kinds(names: tuple[str, ...], pattern: str, matchers: str = "") -> str:
    """The series ``names`` with their kind letter in :data:`KIND_LABEL`, NaN left out."""
    return (
        f'label_replace({{{{__name__=~"{"|".join(names)}",job="{{job}}"{matchers}}}}}, '
        f'"{KIND_LABEL}", "$1", "__name__", "{pattern}") >= 0'
    )


class Query(enum.Enum):
    """Every query of a cycle; its value is the PromQL with ``{job}`` for the job matcher.

    Series that carry nothing (NaN: a figure not known yet) are left out on the server,
    and so are the common cases that need no series: a target that is up, a node that
    is not growing. What stays is what a node's row shows.
    """

    #: Targets Prometheus cannot scrape.
    DOWN = 'up{{job="{job}"}} == 0'
    #: When each node's raylet series was last scraped: its age, for staleness.
    FRESH = f'timestamp({RAY_NODE_MEM_USED}{{{{job="{{job}}"}}}})'
    #: Node memory as Ray's memory monitor counts it, and its total.
    NODE_USED = f'max by ({INSTANCE_LABEL}, ip) ({RAY_NODE_MEM_USED}{{{{job="{{job}}"}}}})'
    NODE_TOTAL = f'max by ({INSTANCE_LABEL}) ({RAY_NODE_MEM_TOTAL}{{{{job="{{job}}"}}}})'
    #: The freshest sampler's stamp on each node.
    SAMPLED_AT = f"max by ({INSTANCE_LABEL}) ({_STAMP})"
    #: Each group's RSS, processes, growth and PSS age, from each node's freshest sampler.
    GROUPS = (
        f"max by ({INSTANCE_LABEL}, {GROUP_LABEL}, {KIND_LABEL}) "
        f"({_kinds(_GROUP_NAMES, _GROUP_KIND_PATTERN, _RSS_OR_NONE)} "
        f"and {_FRESHEST})"
    )
    #: Each group's PSS, where the sampler reads it.
    GROUP_PSS = (
        f"max by ({INSTANCE_LABEL}, {GROUP_LABEL}) "
        f'({RAY_GROUP_MEMORY}{{{{job="{{job}}",{MEMORY_TYPE_LABEL}="pss"}}}} >= 0 '
        f"and {_FRESHEST})"
    )
    #: The node's own figures (used, growth, outside growth, limit, time to limit).
    NODE_FIGURES = (
        f"max by ({INSTANCE_LABEL}, {KIND_LABEL}) "
        f"({_kinds(_NODE_NAMES, _NODE_KIND_PATTERN)} and {_FRESHEST})"
    )
    #: Nodes whose sampler says they are growing.
    GROWING = f'max by ({INSTANCE_LABEL}) ({_GROWING}{{{{job="{{job}}"}}}} and {_FRESHEST}) == 1'
    #: The freshest sampler's window, labelled with its identity.
    WINDOW = (
        f"max by ({INSTANCE_LABEL}, {SAMPLER_LABEL}, {STARTED_BY_LABEL}) "
        f'({NODE_SERIES[-1]}{{{{job="{{job}}"}}}} and {_FRESHEST})'
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

"""The fake raylet, kept importable here; it lives in :mod:`raylens.simulation.raylet`."""

from raylens.simulation.raylet import (
    RECORDED_PAYLOADS,
    FakeRaylet,
    RayletCall,
    format_sample_value,
    load_payload,
    load_recorded_payload,
)

__all__ = [
    "RECORDED_PAYLOADS",
    "FakeRaylet",
    "RayletCall",
    "format_sample_value",
    "load_payload",
    "load_recorded_payload",
]

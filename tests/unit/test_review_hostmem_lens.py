"""lens: environment variables read the way OpenTelemetry documents them, and exporters' edges."""

from __future__ import annotations

import pytest

from raylens.lens import TelemetryConfig


def test_an_empty_variable_counts_as_unset() -> None:
    # OpenTelemetry's configuration rules: an empty value is the same as no value.
    config = TelemetryConfig.from_env(
        {
            "RAYLENS_TELEMETRY": "",
            "RAYLENS_EXPORTER": "",
            "RAYLENS_PROMETHEUS_ADDR": " ",
            "OTEL_SERVICE_NAME": "",
            "OTEL_RESOURCE_ATTRIBUTES": "",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
            "OTEL_METRIC_EXPORT_INTERVAL": "",
        }
    )

    assert config == TelemetryConfig.from_env({})


def test_service_name_from_resource_attributes_unless_otel_service_name_is_set() -> None:
    attributes = "service.name=from-attributes,team=rl"

    named = TelemetryConfig.from_env({"OTEL_RESOURCE_ATTRIBUTES": attributes})
    assert named.service_name == "from-attributes"
    overridden = TelemetryConfig.from_env(
        {"OTEL_RESOURCE_ATTRIBUTES": attributes, "OTEL_SERVICE_NAME": "trainer"}
    )
    assert overridden.service_name == "trainer"


@pytest.mark.parametrize("value", ["host:\u00b2", "host:\u0669"])
def test_a_port_of_non_ascii_digits_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError) as error:
        TelemetryConfig.from_env({"RAYLENS_PROMETHEUS_ADDR": value})

    message = str(error.value)
    assert "RAYLENS_PROMETHEUS_ADDR" in message
    assert repr(value) in message
    assert "host:port" in message

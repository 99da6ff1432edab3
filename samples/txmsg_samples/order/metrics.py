"""``txmsg demo --metrics-port N``: the demo's services exported to Prometheus.

txmsg reports through the global OpenTelemetry meter provider (``docs/guide/observability.md``);
here that provider is the SDK's with the OpenTelemetry Prometheus exporter, served over HTTP at
``http://127.0.0.1:N/metrics`` while the demo runs, so a Prometheus (and the Grafana dashboard in
``docs/grafana/txmsg-dashboard.json``) can watch the order services work.  The packages are the
``metrics`` extra of txmsg-samples; without them the option says what to install.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

INSTALL = "pip install 'txmsg-samples[metrics]'"


class MetricsUnavailable(click.ClickException):
    """The SDK or the Prometheus exporter is missing, or the port cannot be served."""


@dataclass
class MetricsEndpoint:
    """A running ``/metrics`` endpoint; :meth:`close` stops serving it."""

    url: str
    server: Any

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(port: int, *, host: str = "127.0.0.1") -> MetricsEndpoint:
    """Install the SDK's meter provider with a Prometheus reader as the global one and serve it
    on ``host:port`` (0: a free port, see the returned URL).

    Raises:
        MetricsUnavailable: the packages are missing (the message says what to install), the port
            cannot be bound, or another meter provider was installed already.
    """
    try:
        from opentelemetry import metrics  # noqa: PLC0415 - optional packages (module docstring)
        from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from prometheus_client import start_http_server  # noqa: PLC0415
    except ImportError as exc:
        raise MetricsUnavailable(
            f"--metrics-port needs the OpenTelemetry SDK and its Prometheus exporter ({exc.name} "
            f"is missing): {INSTALL}"
        ) from exc
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise MetricsUnavailable(
            f"--metrics-port {port}: cannot serve metrics on {host}:{port} ({exc.strerror or exc}); "
            "choose a free port (0 picks one)"
        ) from exc
    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader()],
        resource=Resource.create({"service.name": "txmsg-demo"}),
    )
    metrics.set_meter_provider(provider)
    if metrics.get_meter_provider() is not provider:
        server.shutdown()
        server.server_close()
        raise MetricsUnavailable(
            "--metrics-port: another OpenTelemetry meter provider is installed in this process "
            "already; export through that one instead"
        )
    return MetricsEndpoint(url=f"http://{host}:{server.server_port}/metrics", server=server)

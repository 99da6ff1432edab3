"""The OpenTelemetry SDK with in-memory exporters, for the tests of txmsg's telemetry.

The global providers can be set once per process, so one SDK serves every test of a worker
(``telemetry``); spans are made only while a test of this directory runs (the other tests of the
same xdist worker see the API without an SDK: no span, no trace context in their messages), and
every test names its own groups and topics, so it reads only its own spans and data points.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from txmsg import TxMsg
from txmsg.config import TxMsgConfig

#: check every 0.5 s, transactions older than 0.5 s: a check-back comes within about a second.
#: The broker (gRPC on) runs as 5.3.3: a 100 ms op batch keeps commit records inside the timeout,
#: so only the transaction left UNKNOW is checked back (as tests/contract)
TIMINGS: dict[str, Any] = {
    "transaction_timeout_ms": 500,
    "check_interval_ms": 500,
    "check_max": 5,
    "transaction_op_batch_interval_ms": 100,
    "delay_scale": 0.001,
}

CONNECT = {
    "rocketmq": lambda broker, tmp: {
        "name_server": broker.namesrv_addr,
        "client_log_dir": str(tmp / "client-logs"),
        "instance_prefix": "otel",
    },
    "rocketmq5": lambda broker, tmp: {"endpoints": broker.grpc_endpoint},
}


class _Switch(trace.TracerProvider):
    """The SDK's tracer provider while ``recording`` is set, the API's no-op one otherwise.

    Why: the global provider cannot be taken back, and the other tests of an xdist worker must
    see txmsg as without an SDK (no span, no ``traceparent`` written into their messages)."""

    def __init__(self, sdk: TracerProvider) -> None:
        self.recording = threading.Event()
        self._sdk = sdk

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _SwitchTracer(self, self._sdk.get_tracer(*args, **kwargs))


class _SwitchTracer(trace.Tracer):
    def __init__(self, switch: _Switch, sdk: trace.Tracer) -> None:
        self._switch = switch
        self._sdk = sdk
        self._noop = trace.NoOpTracer()

    def _current(self) -> trace.Tracer:
        return self._sdk if self._switch.recording.is_set() else self._noop

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._current().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._current().start_as_current_span(*args, **kwargs)


@dataclass
class Telemetry:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    switch: _Switch

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def points(self, metric: str, **match: Any) -> list[Any]:
        """The data points of ``metric`` whose attributes include ``match`` (dots in keys are
        written as ``__``: ``txmsg__producer__group="g"``)."""
        wanted = {k.replace("__", "."): v for k, v in match.items()}
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name != metric:
                        continue
                    found.extend(
                        p
                        for p in m.data.data_points
                        if all(p.attributes.get(k) == v for k, v in wanted.items())
                    )
        return found

    def total(self, metric: str, **match: Any) -> float:
        """Sum of a counter's (or gauge's) points, or of a histogram's counts."""
        return sum(
            getattr(p, "value", None) or getattr(p, "count", 0)
            for p in self.points(metric, **match)
        )


@pytest.fixture(scope="session")
def _sdk() -> Telemetry:
    exporter = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    provider = _Switch(sdk)
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    assert trace.get_tracer_provider() is provider, "another global tracer provider was set first"
    assert metrics.get_meter_provider() is meter_provider, "another meter provider was set first"
    return Telemetry(exporter, reader, provider)


@pytest.fixture
def telemetry(_sdk: Telemetry) -> Iterator[Telemetry]:
    """The SDK, recording spans for this test (cleared before)."""
    _sdk.exporter.clear()
    _sdk.switch.recording.set()
    yield _sdk
    _sdk.switch.recording.clear()
    _sdk.exporter.clear()


@pytest.fixture(params=["rocketmq", "rocketmq5"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def broker(txmsg_broker_factory: Any) -> Any:
    """The embedded broker, remoting and gRPC, with short check timings."""
    return txmsg_broker_factory(grpc_port=0, **TIMINGS)


@pytest.fixture
def make_app(backend_name: str, broker: Any, tmp_path: Path) -> Iterator[Any]:
    """``make_app(**config)``: a TxMsg on ``backend_name`` at ``broker``; closed at the end."""
    apps: list[TxMsg] = []

    def make(**config: Any) -> TxMsg:
        settings: Mapping[str, Any] = {
            "backend": backend_name,
            **CONNECT[backend_name](broker, tmp_path),
            **config,
        }
        app = TxMsg(TxMsgConfig(**settings))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close(timeout=20)

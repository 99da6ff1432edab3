"""OpenTelemetry traces and metrics of txmsg (``pip install 'txmsg[otel]'``).

txmsg reports through the global tracer and meter providers of the OpenTelemetry API; the
application picks the SDK and exporters (``docs/guide/observability.md``).  Without the API
installed, or with no SDK configured, the hooks cost next to nothing, and ``import txmsg`` loads
none of this (:mod:`txmsg.otel._runtime` imports OpenTelemetry on first use, at ``app.start()``).

* :mod:`txmsg.otel.names` - the instrument, attribute and event names (fixed, for dashboards);
* :mod:`txmsg.otel.hooks` - what the core calls around sends, check-backs and deliveries;
* :mod:`txmsg.otel.gauges` - the observed figures (executor, parked keys, outbox).
"""

from txmsg.otel import names as names

__all__ = ["names"]

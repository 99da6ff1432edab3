"""The gRPC endpoint's lifecycle: a grpcio asyncio server on the broker's own event loop.

Why the same loop: handlers touch the store, topic table, client registry and transaction service
directly, exactly like the remoting handlers, with no locks or thread hops. Bound on the broker's
``--host`` (loopback by default) at ``--grpc-port`` (0 = any free port), started before the broker
announces itself and stopped before the remoting servers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from .. import ports
from .sessions import Sessions
from .stubs import svc_grpc

if TYPE_CHECKING:
    from ..broker import Broker

#: ProxyConfig.grpcMaxInboundMessageSize: a body over maxMessageSize reaches the handler and gets
#: MESSAGE_BODY_TOO_LARGE instead of a transport error
MAX_INBOUND_MESSAGE_SIZE = 130 * 1024 * 1024


#: grpc-java's answer to a request that is not valid protobuf (grpcio's own would be UNKNOWN)
MALFORMED_DETAILS = "Invalid protobuf byte sequence"


class Malformed:
    """What a request that failed to parse becomes, so the handler can answer like the proxy."""

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError, or anything a hostile input triggers
            return Malformed(str(exc))

    return parse


def _guard_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def guarded(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INTERNAL, MALFORMED_DETAILS)
        return await behavior(request, context)

    return guarded


def _guard_stream(behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def guarded(request: Any, context: Any) -> AsyncIterator[Any]:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INTERNAL, MALFORMED_DETAILS)
        async for response in behavior(request, context):
            yield response

    return guarded


class _LenientHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The generated handlers, with parse failures answered INTERNAL as grpc-java does (the stream
    handler, Telemetry, checks for :class:`Malformed` itself)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        #: method -> wrapped handler: grpcio asks for the handler on every call (hot path)
        self._wrapped: dict[str, Any] = {}

    def service(self, details: Any) -> Any:
        method = details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            wrapped = self._wrap(self.inner.service(details))
            if wrapped is not None:
                self._wrapped[method] = wrapped
        return wrapped

    @staticmethod
    def _wrap(handler: Any) -> Any:
        if handler is None or handler.request_deserializer is None:
            return handler
        changes: dict[str, Any] = {"request_deserializer": _lenient(handler.request_deserializer)}
        if handler.unary_unary is not None:
            changes["unary_unary"] = _guard_unary(handler.unary_unary)
        if handler.unary_stream is not None:
            changes["unary_stream"] = _guard_stream(handler.unary_stream)
        return handler._replace(**changes)


class _Capture:
    """Stands in for the server while the generated ``add_..._to_server`` registers its handler."""

    def __init__(self) -> None:
        self.handlers: list[Any] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        raise NotImplementedError  # newer generated code: register through the generic handler


class GrpcEndpoint:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sessions = Sessions(broker)
        self.server: Any = None
        self.port = broker.config.grpc_port or 0
        from .servicer import MessagingServicer  # noqa: PLC0415 - import cycle: servicer imports this module

        self.servicer = MessagingServicer(self)

    @property
    def advertised_host(self) -> str:
        return self.broker.config.advertised_ip

    @property
    def endpoint(self) -> str:
        """``host:port`` for ``ClientConfiguration(endpoints=...)``."""
        return f"{self.advertised_host}:{self.port}"

    async def start(self) -> None:
        limit = max(MAX_INBOUND_MESSAGE_SIZE, self.broker.config.max_message_size + (1 << 20))
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ]
        )
        capture = _Capture()
        svc_grpc.add_MessagingServiceServicer_to_server(self.servicer, capture)
        server.add_generic_rpc_handlers([_LenientHandler(h) for h in capture.handlers])
        # an empty host is the user's explicit "all interfaces", as on the remoting port
        host = self.broker.config.host or "0.0.0.0"  # noqa: S104 - see above; the default host is loopback
        port = self._bind(server, host)
        self.port = port
        self.sessions.local_addr = f"{self.advertised_host}:{port}"
        await server.start()
        self.server = server
        self.broker.logs.broker.info(
            "main", f"grpc server start success, listening on {host}:{port}"
        )

    def _bind(self, server: Any, host: str) -> int:
        """Add the listening port to ``server`` and return it: ``self.port``, or with 0 a free one
        (below the ephemeral range first with ``restartable_ports``, as the remoting ports).

        Why the probe before each add: grpc reports a taken port as a bare RuntimeError (and an
        error line of its own on stderr), so a port surely taken is refused here first as
        :class:`~txmsg_broker.ports.PortInUse`, which ``txmsg broker`` turns into its one-line
        refusal; the add stays the real test (another process may take the port in between)."""
        wanted = self.port
        candidates = (
            ports.restartable_candidates()
            if wanted == 0 and self.broker.config.restartable_ports
            else []
        )
        for port in candidates:
            if not ports.can_bind(host, port):
                continue
            with contextlib.suppress(RuntimeError):  # taken since the probe: the next one
                bound = int(server.add_insecure_port(f"{host}:{port}"))
                if bound:
                    return bound
        if wanted and not ports.can_bind(host, wanted):
            raise ports.PortInUse("gRPC", host, wanted)
        try:
            bound = int(server.add_insecure_port(f"{host}:{wanted}"))
        except RuntimeError as exc:  # grpc's "Failed to bind to address": a clean OSError instead
            if wanted and not ports.can_bind(host, wanted):
                raise ports.PortInUse("gRPC", host, wanted) from exc
            raise OSError(f"cannot bind the gRPC endpoint to {host}:{wanted}: {exc}") from exc
        if bound == 0:
            raise OSError(f"cannot bind the gRPC endpoint to {host}:{wanted}")
        return bound

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=1.0)
            self.server = None

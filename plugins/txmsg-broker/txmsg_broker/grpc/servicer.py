"""``apache.rocketmq.v2.MessagingService``: request context, dispatch, and the consumer seam.

Why one dispatcher: the proxy runs every request through the same pipeline (client id required, a
``GrpcProxyException`` becomes the response ``status``, anything else INTERNAL_SERVER_ERROR and a log
line), so each RPC here is one line that names its handler.

Consumer seam: ``ReceiveMessage``, ``AckMessage``, ``ChangeInvisibleDuration``, ``QueryAssignment`` and
``ForwardMessageToDeadLetterQueue`` are delegated to ``txmsg_broker.grpc.consumer`` when that module
exists: its ``install(endpoint) -> ConsumerRpcs`` returns an object with the methods of
:class:`ConsumerRpcs` (``ReceiveMessage`` is an async generator of responses). Until then they are
answered NOT_IMPLEMENTED, like a proxy without that processor. Consumer clients' Settings and
Heartbeats go to its optional ``apply_settings(session, settings)`` / ``heartbeat(session, request)``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from . import routes
from .producer import ProducerRpcs, validate_topic
from .server import MALFORMED_DETAILS, GrpcEndpoint, Malformed
from .sessions import ClientSession, Sessions
from .status import ProxyError, client_id_required, not_implemented, ok, status
from .stubs import Code, pb, svc, svc_grpc

CLIENT_ID_HEADER = "x-mq-client-id"
LANGUAGE_HEADER = "x-mq-language"
THREAD = "GrpcClientManagerThreadPool_1"


class ConsumerRpcs(Protocol):
    """What ``txmsg_broker.grpc.consumer.install(endpoint)`` returns (see the module docstring)."""

    def ReceiveMessage(
        self, session: ClientSession, request: Any, context: Any
    ) -> AsyncIterator[Any]: ...
    async def AckMessage(self, session: ClientSession, request: Any) -> Any: ...
    async def ChangeInvisibleDuration(self, session: ClientSession, request: Any) -> Any: ...
    async def QueryAssignment(self, session: ClientSession, request: Any) -> Any: ...
    async def ForwardMessageToDeadLetterQueue(
        self, session: ClientSession, request: Any
    ) -> Any: ...


def peer_address(context: Any) -> str:
    """``ipv4:127.0.0.1:5000`` / ``ipv6:[::1]:5000`` -> ``127.0.0.1:5000`` / ``[::1]:5000``."""
    peer = str(context.peer() or "")
    return peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer


def header(context: Any, name: str) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return str(value)
    return ""


class MessagingServicer(svc_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(self, endpoint: GrpcEndpoint) -> None:
        self.endpoint = endpoint
        self.broker = endpoint.broker
        self.sessions: Sessions = endpoint.sessions
        self.producer = ProducerRpcs(self.broker, self.sessions)
        self.consumer: Any = None
        try:
            module = importlib.import_module("txmsg_broker.grpc.consumer")
        except ModuleNotFoundError as exc:
            if exc.name != "txmsg_broker.grpc.consumer":
                raise
        else:
            self.consumer = module.install(endpoint)

    # -- plumbing --------------------------------------------------------------------------------
    def session(self, context: Any) -> ClientSession:
        client_id = header(context, CLIENT_ID_HEADER)
        if not client_id.strip():
            raise client_id_required()
        known = self.sessions.by_id.get(
            client_id
        )  # hot path: peer and language only for a new client
        if known is not None:
            return known
        return self.sessions.get(client_id, peer_address(context), header(context, LANGUAGE_HEADER))

    async def _unary(
        self, rpc: str, context: Any, response_type: Any, handler: Callable[[ClientSession], Any]
    ) -> Any:
        try:
            result = handler(self.session(context))
            if inspect.isawaitable(result):
                result = await result
            return result
        except ProxyError as exc:
            return response_type(status=status(exc.code, exc.message))
        except Exception as exc:  # noqa: BLE001 - the proxy's "internal server error"; the broker keeps serving
            self.broker.logs.broker.error(THREAD, f"gRPC {rpc} failed: {exc!r}")
            return response_type(
                status=status(Code.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
            )

    def _consumer(self, rpc: str) -> Callable[..., Any]:
        method = getattr(self.consumer, rpc, None) if self.consumer is not None else None
        if method is None:
            raise not_implemented(rpc)
        return method  # type: ignore[no-any-return]

    # -- routes, clients -------------------------------------------------------------------------
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "QueryRoute",
            context,
            svc.QueryRouteResponse,
            lambda s: routes.query_route(
                self.broker, request, self.endpoint.advertised_host, self.endpoint.port
            ),
        )

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "Heartbeat", context, svc.HeartbeatResponse, lambda s: self._heartbeat(s, request)
        )

    def _heartbeat(self, session: ClientSession, request: Any) -> Any:
        settings = session.settings
        if settings is None:
            raise ProxyError(
                Code.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client"
            )
        if settings.client_type == pb.ClientType.PRODUCER:
            self.sessions.heartbeat(session)
        elif settings.client_type in (pb.ClientType.PUSH_CONSUMER, pb.ClientType.SIMPLE_CONSUMER):
            hook = getattr(self.consumer, "heartbeat", None)
            if hook is not None:
                return hook(session, request)
        else:
            raise ProxyError(
                Code.UNRECOGNIZED_CLIENT_TYPE, pb.ClientType.Name(settings.client_type)
            )
        return svc.HeartbeatResponse(status=ok())

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "NotifyClientTermination",
            context,
            svc.NotifyClientTerminationResponse,
            lambda s: self._terminate(s),
        )

    def _terminate(self, session: ClientSession) -> Any:
        if not self.sessions.terminate(session):
            raise ProxyError(
                Code.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client"
            )
        return svc.NotifyClientTerminationResponse(status=ok())

    # -- producer --------------------------------------------------------------------------------
    async def SendMessage(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "SendMessage",
            context,
            svc.SendMessageResponse,
            lambda s: self.producer.send_message(s, request),
        )

    async def EndTransaction(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "EndTransaction",
            context,
            svc.EndTransactionResponse,
            lambda s: self.producer.end_transaction(s, request),
        )

    # -- consumer (seam) -------------------------------------------------------------------------
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "QueryAssignment",
            context,
            svc.QueryAssignmentResponse,
            lambda s: self._consumer("QueryAssignment")(s, request),
        )

    async def AckMessage(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "AckMessage",
            context,
            svc.AckMessageResponse,
            lambda s: self._consumer("AckMessage")(s, request),
        )

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "ChangeInvisibleDuration",
            context,
            svc.ChangeInvisibleDurationResponse,
            lambda s: self._consumer("ChangeInvisibleDuration")(s, request),
        )

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        return await self._unary(
            "ForwardMessageToDeadLetterQueue",
            context,
            svc.ForwardMessageToDeadLetterQueueResponse,
            lambda s: self._consumer("ForwardMessageToDeadLetterQueue")(s, request),
        )

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            session = self.session(context)
            stream = self._consumer("ReceiveMessage")(session, request, context)
        except ProxyError as exc:
            yield svc.ReceiveMessageResponse(status=status(exc.code, exc.message))
            return
        async for response in stream:
            yield response

    # -- telemetry -------------------------------------------------------------------------------
    async def Telemetry(self, request_iterator: AsyncIterator[Any], context: Any) -> None:
        """Answer each Settings with the merged Settings (status OK); later commands pushed by the
        broker (check-backs) go down the same stream, which the client's startup waits for."""
        outbox: asyncio.Queue[Any] = asyncio.Queue()
        client_id = header(context, CLIENT_ID_HEADER).strip()
        session = (
            self.sessions.get(client_id, peer_address(context), header(context, LANGUAGE_HEADER))
            if client_id
            else None
        )

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if isinstance(command, Malformed):
                        outbox.put_nowait(command)
                        break
                    if session is None:
                        exc = client_id_required()
                        outbox.put_nowait(
                            svc.TelemetryCommand(status=status(exc.code, exc.message))
                        )
                        continue
                    if command.WhichOneof("command") != "settings":
                        continue  # thread stack traces / verify results answer requests we never send
                    outbox.put_nowait(self._settings(session, command.settings, outbox))
            except Exception as exc:  # noqa: BLE001 - the stream ends; the client rebuilds it
                outbox.put_nowait(exc)
            finally:
                outbox.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                item = await outbox.get()
                if item is None:
                    break
                if isinstance(item, Malformed):
                    await context.abort(grpc.StatusCode.INTERNAL, MALFORMED_DETAILS)
                if isinstance(item, ProxyError):
                    code = (
                        grpc.StatusCode.INVALID_ARGUMENT
                        if Code.BAD_REQUEST <= item.code < Code.INTERNAL_ERROR
                        else grpc.StatusCode.INTERNAL
                    )
                    await context.abort(
                        code, f"process client telemetryCommand failed. {item.message}"
                    )
                if isinstance(item, Exception):
                    break
                await context.write(item)
        finally:
            reader.cancel()
            if session is not None:
                self.sessions.stream_closed(session, outbox)

    def _settings(self, session: ClientSession, settings: Any, outbox: asyncio.Queue[Any]) -> Any:
        """``processAndWriteClientSettings``: a command to write, or a ProxyError to abort with."""
        kind = settings.WhichOneof("pub_sub")
        try:
            if kind == "publishing":
                for topic in settings.publishing.topics:
                    validate_topic(topic.name)
            elif kind is None:
                return ProxyError(
                    Code.BAD_REQUEST, "there is no publishing or subscription data in settings"
                )
            session.outbox = outbox
            merged = self.sessions.apply_settings(session, settings)
            if kind == "subscription":
                hook = getattr(self.consumer, "apply_settings", None)
                if hook is not None:
                    merged = hook(session, settings) or merged
        except ProxyError as exc:
            return exc
        return svc.TelemetryCommand(status=ok(), settings=merged)


Handler = Callable[[ClientSession], Awaitable[Any] | Any]

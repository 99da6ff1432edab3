"""The gRPC endpoint's lifecycle: a grpcio asyncio server on the broker's own event loop.

Why the same loop: handlers touch the store, topic table, client registry and transaction service
directly, exactly like the remoting handlers, with no locks or thread hops. Bound on the broker's
``--host`` (loopback by default) at ``--grpc-port`` (0 = any free port), started before the broker
announces itself and stopped before the remoting servers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from .sessions import Sessions
from .stubs import svc_grpc

if TYPE_CHECKING:
    from ..broker import Broker

#: ProxyConfig.grpcMaxInboundMessageSize: a body over maxMessageSize reaches the handler and gets
#: MESSAGE_BODY_TOO_LARGE instead of a transport error
MAX_INBOUND_MESSAGE_SIZE = 130 * 1024 * 1024


class GrpcEndpoint:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sessions = Sessions(broker)
        self.server: Any = None
        self.port = broker.config.grpc_port or 0
        from .servicer import MessagingServicer

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
        svc_grpc.add_MessagingServiceServicer_to_server(self.servicer, server)
        host = self.broker.config.host or "0.0.0.0"
        port = server.add_insecure_port(f"{host}:{self.port}")
        if port == 0:
            raise OSError(f"cannot bind the gRPC endpoint to {host}:{self.port} (in use?)")
        self.port = port
        self.sessions.local_addr = f"{self.advertised_host}:{port}"
        await server.start()
        self.server = server
        self.broker.logs.broker.info("main", f"grpc server start success, listening on {host}:{port}")

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=1.0)
            self.server = None

"""The generated ``apache.rocketmq.v2`` modules, taken from the official client package.

Why not our own copy: the protocol belongs to apache/rocketmq-apis and the official 5.x Python client
(PyPI ``rocketmq-python-client``, brought by ``txmsg-broker[grpc]``) ships the generated code; depending on it keeps the
endpoint exactly as new as the client the tests drive it with.
"""

from __future__ import annotations

from typing import Any

try:
    # the 5.x client's package, whichever rocketmq/__init__.py pip wrote last (txmsg-rocketmq5)
    from txmsg_rocketmq5.package import ensure_client_package

    ensure_client_package()
    from rocketmq.grpc_protocol import definition_pb2 as _definition
    from rocketmq.grpc_protocol import service_pb2 as _service
    from rocketmq.grpc_protocol import service_pb2_grpc as _service_grpc
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"the gRPC endpoint needs the generated apache.rocketmq.v2 stubs of rocketmq-python-client 5.x "
        f"({exc}). Install them with `pip install 'txmsg-broker[grpc]'`"
    ) from exc

#: definition.proto (Message, Resource, Code, Settings, ...)
pb: Any = _definition
#: service.proto (requests, responses, TelemetryCommand)
svc: Any = _service
#: generated servicer base class and ``add_MessagingServiceServicer_to_server``
svc_grpc: Any = _service_grpc

Code: Any = pb.Code

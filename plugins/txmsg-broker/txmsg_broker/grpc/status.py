"""Status codes and messages as the RocketMQ 5 proxy answers them (``apache.rocketmq.v2.Code``).

Why an exception: the proxy validates in layers (context, topic, message, route, type) and turns the
first ``GrpcProxyException`` into the response's ``status``; handlers here raise :class:`ProxyError`
and the servicer does the same, so a refused request is answered with a status and nothing stored.
"""

from __future__ import annotations

from typing import Any

from .stubs import Code, pb

#: ``FAQUrl.attachDefaultURL`` suffix of MQClientException messages (topic not found)
FAQ_SUFFIX = "\nFor more information, please visit the url, https://rocketmq.apache.org/docs/bestPractice/06FAQ"


class ProxyError(Exception):
    """A request the proxy refuses: ``code`` (``Code`` value) and the proxy's message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status(code: int, message: str | None = None) -> Any:
    """``ResponseBuilder.buildStatus(code, message)``: the code's name when no message is given."""
    return pb.Status(code=code, message=message if message is not None else Code.Name(code))


def ok() -> Any:
    return status(Code.OK)


def client_id_required() -> ProxyError:
    return ProxyError(Code.CLIENT_ID_REQUIRED, "client id cannot be empty")


def topic_not_found(topic: str) -> ProxyError:
    return ProxyError(
        Code.TOPIC_NOT_FOUND,
        f"CODE: 17  DESC: No topic route info in name server for the topic: {topic}{FAQ_SUFFIX}",
    )


def not_implemented(rpc: str) -> ProxyError:
    """What a proxy answers for an RPC it does not serve (``REQUEST_CODE_NOT_SUPPORTED`` mapping)."""
    return ProxyError(Code.NOT_IMPLEMENTED, f"{rpc} is not implemented by this broker yet")

"""RocketMQ 5 gRPC endpoint (``apache.rocketmq.v2.MessagingService``) of the embedded broker.

Enabled by ``txmsg broker --grpc-port PORT`` (``BrokerConfig.grpc_port``). One module per job:
``server`` (lifecycle), ``servicer`` (request context, dispatch, consumer seam), ``routes``
(QueryRoute), ``sessions`` (settings, telemetry streams, gRPC clients as check-back channels),
``producer`` (SendMessage, EndTransaction), ``convert`` (proto <-> stored message), ``status``
(the proxy's codes and messages), ``stubs`` (the generated code of ``rocketmq-python-client``),
``doctor`` (``txmsg doctor`` import check). The consumer RPCs live in ``consumer`` (see ``servicer``).

Deliberately light: importing this package does not import grpc (``doctor`` must load without it).
"""

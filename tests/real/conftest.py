"""Tests that only mean something against a real RocketMQ cluster (``--real-remoting``,
``--real-grpc``; docs/guide/testing.md): the order demo and a short chaos run pointed at it.
Every test here is marked ``real_broker`` (skipped without the options); ``backend_settings``
gives the command-line flags of a backend for the cluster, skipping a backend whose address was
not given."""

from __future__ import annotations

import pytest
from txmsg_broker.real_cluster import RealCluster

BACKENDS = ("rocketmq", "rocketmq5")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend_flags(backend: str, txmsg_real_cluster: RealCluster) -> list[str]:
    """``--name-server`` (and, for rocketmq5, ``--endpoints``) of the real cluster."""
    if backend == "rocketmq":
        return ["--name-server", txmsg_real_cluster.namesrv_addr]
    if txmsg_real_cluster.grpc_endpoint is None:
        pytest.skip("rocketmq5 needs the cluster's 5.x proxy: give --real-grpc HOST:PORT")
    return [
        "--name-server",
        txmsg_real_cluster.namesrv_addr,
        "--endpoints",
        txmsg_real_cluster.grpc_endpoint,
    ]

"""GET_BROKER_CONFIG (26): the broker's settings as a properties text, as ``mqadmin getBrokerConfig`` reads them.

Java (4.9.8 and 5.3.3 ``AdminBrokerProcessor.getBrokerConfig``): the body is
``Configuration.getAllConfigsFormatString()`` - ``MixAll.properties2String``, one ``key=value`` line per
setting, ``\\n``-terminated, in no particular order - and the response header has one field, ``version``
(the configuration's DataVersion as JSON).  The real broker lists every field of BrokerConfig,
NettyServerConfig, NettyClientConfig and MessageStoreConfig (178 keys on 4.9.8, 411 on 5.3.3); this one
lists the settings it has, under the same key names (each one present in a real 4.9.8's and 5.3.3's
answer), so a client (``txmsg doctor``) reads ``transactionTimeOut`` and, on a 5.x broker,
``transactionOpBatchInterval`` the same way from either.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from .codec import SUCCESS, RemotingCommand
from .transport import Connection

if TYPE_CHECKING:
    from .broker import Broker

GET_BROKER_CONFIG = 26


def broker_properties(broker: Broker) -> dict[str, str]:
    """The settings under the real broker's key names (``BrokerConfig`` / ``MessageStoreConfig``)."""
    c = broker.config
    props: dict[str, object] = {
        "brokerClusterName": c.cluster_name,
        "brokerName": c.broker_name,
        "brokerId": 0,
        "brokerIP1": c.advertised_ip,
        "brokerIP2": c.advertised_ip,
        "listenPort": c.broker_port,
        "namesrvAddr": broker.namesrv_addr,
        "autoCreateTopicEnable": str(c.auto_create_topics).lower(),
        "defaultTopicQueueNums": c.default_queue_nums,
        "registerNameServerPeriod": c.register_interval_ms,
        "aclEnable": str(c.acl is not None).lower(),
        "transactionTimeOut": c.transaction_timeout_ms,
        "transactionCheckInterval": c.check_every_ms,
        "transactionCheckMax": c.check_max,
        "fileReservedTime": c.file_reserved_time,
        "flushDiskType": "SYNC_FLUSH" if c.flush == "sync" else "ASYNC_FLUSH",
        "brokerRole": "ASYNC_MASTER",
        "maxMessageSize": c.max_message_size,
        "storePathRootDir": str(c.data_dir),
    }
    if c.broker_version == "5.3.3":  # 5.1+ BrokerConfig only
        props["transactionOpBatchInterval"] = c.op_batch_interval_ms
        props["transactionOpMsgMaxSize"] = c.transaction_op_msg_max_size
    return {key: str(value) for key, value in props.items()}


def install(broker: Broker) -> None:
    started = int(time.time() * 1000)

    async def get_broker_config(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        text = "".join(f"{k}={v}\n" for k, v in broker_properties(broker).items())
        version = json.dumps(
            {"counter": 1, "stateVersion": 0, "timestamp": started}, separators=(",", ":")
        )
        return cmd.response(SUCCESS, None, {"version": version}, text.encode("utf-8"))

    broker.register(GET_BROKER_CONFIG, get_broker_config, inline=True)

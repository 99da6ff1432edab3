"""Broker settings. Defaults equal the real broker's (``transactionTimeOut`` 6 s, 15 checks; check interval
60 s on 4.9.8, 30 s on 5.3.3).

``broker_version`` says which real broker this one behaves as where the two differ: ``"4.9.8"`` writes a
transaction's op record at once; ``"5.3.3"`` batches op records (``transactionOpBatchInterval``, 3000 ms) as
5.1+ does, scans half messages every 30 s and logs 5.x lines.  Unset: 5.3.3 when the gRPC endpoint (the 5.x
proxy's protocol) is on, else 4.9.8.  Settings left unset take the chosen version's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .acl_config import check_acl_setting

DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: ``transaction.log`` formats: RocketMQ 4.9.x and 5.x (``BrokerConfig.log_format``)
LOG_FORMATS = (4, 5)
#: the real brokers this one can behave as (``BrokerConfig.broker_version``)
BROKER_VERSIONS = ("4.9.8", "5.3.3")
#: 5.3.3 ``BrokerConfig``: ``transactionOpBatchInterval`` and ``transactionOpMsgMaxSize``
DEFAULT_OP_BATCH_INTERVAL_MS = 3000
DEFAULT_OP_MSG_MAX_SIZE = 4096
#: ``transactionCheckInterval`` defaults: 4.9.8 60 s, 5.3.3 30 s
DEFAULT_CHECK_INTERVAL_MS = {"4.9.8": 60000, "5.3.3": 30000}


@dataclass
class BrokerConfig:
    data_dir: Path = field(default_factory=lambda: Path("./txmsg-broker-data"))
    log_dir: Path = field(default_factory=lambda: Path("./txmsg-broker-logs"))
    host: str = "127.0.0.1"
    namesrv_port: int = 9876
    broker_port: int = 10911
    transaction_timeout_ms: int = 6000
    #: transactionCheckInterval; None = the version's default (4.9.8: 60000, 5.3.3: 30000)
    check_interval_ms: int | None = None
    check_max: int = 15
    flush: Literal["sync", "async"] = "async"
    auto_create_topics: bool = True
    enforce_topic_types: bool = True
    #: also register a producer channel from its sends / END_TRANSACTION.  Off (default) = a real
    #: broker, which learns check-back channels from HEART_BEAT only; on = a non-standard shortcut
    learn_producers_from_sends: bool = False
    transaction_log_level: str = "INFO"
    #: transaction.log format of remoting traffic: 4 = the 4.9.8 broker's (quoted header, bname,
    #: check-backs at DEBUG), 5 = a 5.1+ broker's (unquoted, no bname, an INFO line per check-back)
    #: None = the version's (4 for 4.9.8, 5 for 5.3.3)
    log_format: int | None = None
    #: "4.9.8" or "5.3.3" (see the module docstring); None = 5.3.3 with ``grpc_port``, else 4.9.8
    broker_version: str | None = None
    #: 5.x ``transactionOpBatchInterval``: commit/rollback op records are written in batches this often
    #: (so the check service can see a finished transaction as pending). None = 3000 on 5.3.3, 0 (write
    #: at once) on 4.9.8, which has no such batching; 0 on 5.3.3 also writes at once
    transaction_op_batch_interval_ms: int | None = None
    #: 5.x ``transactionOpMsgMaxSize``: a batch is written early once its body reaches this many bytes
    transaction_op_msg_max_size: int = DEFAULT_OP_MSG_MAX_SIZE
    #: ``fileReservedTime`` (hours, Java default 72 in 4.9.8 and 5.3.3).  The check service discards
    #: a half message born longer ago than this without a check-back (Java ``needSkip``); the
    #: embedded store does not delete old files by it
    file_reserved_time: int = 72
    #: Java's ``MAX_PROCESS_TIME_LIMIT`` (a constant, 60 s in 4.9.8 and 5.3.3): one check pass over the
    #: half queue stops after this long and the next pass goes on where it stopped.  Not a broker
    #: setting; lowered only by tests that need a pass to hit the limit
    max_process_time_ms: int = 60000
    #: multiplies RocketMQ's delay levels (1s 5s 10s ... 2h); e.g. 0.01 makes level 3 (10 s) take 0.1 s
    delay_scale: float = 1.0
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    #: RocketMQ 5 gRPC endpoint (``txmsg_broker.grpc``) port; None = off, 0 = any free port
    grpc_port: int | None = None
    #: ports given as 0 are chosen below the kernel's ephemeral range (``ports.py``), where no
    #: outgoing connection takes one while the broker is down: for a test that restarts the
    #: broker on the same ports.  False = the kernel's choice, as for any server
    restartable_ports: bool = False
    #: a RocketMQ 4.9 ``plain_acl.yml``: every broker request is checked against it (``acl.py``); None = off
    acl: Path | None = None
    broker_name: str = "broker-a"
    #: 4.9.8 ``brokerIP1``: the IP published in routes and message ids when it is not the bound
    #: ``host`` (a NAT/port-forward address, or the chaos run's fault proxy on another loopback IP)
    broker_ip1: str | None = None
    #: external name server(s) ``host:port[;host:port]`` (several brokers, ``txmsg broker --brokers N``):
    #: the broker then serves no name server of its own and registers with these (REGISTER_BROKER)
    namesrv_addr: str | None = None
    #: how often a broker with external name servers re-registers (4.9.8 ``registerNameServerPeriod``)
    register_interval_ms: int = 30000
    cluster_name: str = "DefaultCluster"
    default_queue_nums: int = 4
    flush_interval_ms: int = 500
    #: how long an orderly consumer's queue lock (LOCK_BATCH_MQ) lives after its last renewal: Java's
    #: ``-Drocketmq.broker.rebalance.lockMaxLiveTime`` (RebalanceLockManager, default 60000).  Clients
    #: renew every 20 s; a crashed client's queues come free this long after its last renewal
    rebalance_lock_max_live_time_ms: int = 60000
    #: tests only: the broker's time-driven work follows a :class:`~txmsg_broker.clock.ManualClock`
    #: that moves only on request (``BrokerProcess.advance``, ``check_now``); off = wall time
    manual_clock: bool = False

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        self.log_dir = Path(self.log_dir)
        if self.flush not in ("sync", "async"):
            raise ValueError(f"flush must be 'sync' or 'async', got {self.flush!r}")
        for name in (
            "transaction_timeout_ms",
            "transaction_op_msg_max_size",
            "check_max",
            "max_process_time_ms",
            "max_message_size",
            "register_interval_ms",
            "rebalance_lock_max_live_time_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.file_reserved_time < 0:
            raise ValueError(
                f"file_reserved_time is in hours and must be 0 or more, got {self.file_reserved_time}"
            )
        self._resolve_version()
        if self.delay_scale <= 0:
            raise ValueError(f"delay_scale must be positive, got {self.delay_scale}")
        if self.acl is not None:
            self.acl = check_acl_setting(Path(self.acl), self.grpc_port)

    def _resolve_version(self) -> None:
        """Check ``broker_version`` and fill the settings left unset with that version's defaults."""
        if self.broker_version is None:
            self.broker_version = "5.3.3" if self.grpc_port is not None else "4.9.8"
        self.broker_version = str(self.broker_version)
        if self.broker_version not in BROKER_VERSIONS:
            raise ValueError(
                f"broker_version must be 4.9.8 or 5.3.3 (the real broker to behave as), got "
                f"{self.broker_version!r}"
            )
        five = self.broker_version == "5.3.3"
        if self.log_format is None:
            self.log_format = 5 if five else 4
        if str(self.log_format) not in {str(f) for f in LOG_FORMATS}:
            raise ValueError(
                f"log_format must be 4 (RocketMQ 4.9) or 5 (RocketMQ 5.x), got {self.log_format!r}"
            )
        self.log_format = int(self.log_format)
        if self.check_interval_ms is None:
            self.check_interval_ms = DEFAULT_CHECK_INTERVAL_MS[self.broker_version]
        if self.check_interval_ms <= 0:
            raise ValueError(f"check_interval_ms must be positive, got {self.check_interval_ms}")
        if self.transaction_op_batch_interval_ms is None:
            self.transaction_op_batch_interval_ms = DEFAULT_OP_BATCH_INTERVAL_MS if five else 0
        if self.transaction_op_batch_interval_ms < 0:
            raise ValueError(
                "transaction_op_batch_interval_ms must be 0 (write op records at once) or positive, "
                f"got {self.transaction_op_batch_interval_ms}"
            )
        if self.transaction_op_batch_interval_ms > 0 and not five:
            raise ValueError(
                "transaction_op_batch_interval_ms is a RocketMQ 5.1+ setting (transactionOpBatchInterval); "
                "a 4.9.8 broker writes op records at once. Use broker_version='5.3.3' "
                "(--broker-version 5.3.3) or leave it out."
            )

    @property
    def check_every_ms(self) -> int:
        """``check_interval_ms`` after :meth:`_resolve_version` (always set)."""
        assert self.check_interval_ms is not None  # noqa: S101 - set in __post_init__
        return self.check_interval_ms

    @property
    def op_batch_interval_ms(self) -> int:
        """``transaction_op_batch_interval_ms`` after :meth:`_resolve_version`: 0 = op records at once."""
        return self.transaction_op_batch_interval_ms or 0

    @property
    def tx_log_format(self) -> int:
        """``log_format`` after :meth:`_resolve_version` (4 or 5)."""
        return 5 if self.log_format == 5 else 4

    @property
    def bind_ip(self) -> str:
        """The IPv4 literal this process serves on (0.0.0.0 → loopback): the name server's address."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "", "localhost") else self.host  # noqa: S104 - a comparison, not a bind

    @property
    def advertised_ip(self) -> str:
        """The IPv4 literal published in routes (clients must reach it): ``broker_ip1`` or the bind IP."""
        return self.broker_ip1 or self.bind_ip

"""What one chaos run is made of, written to ``<workdir>/chaos.json`` for the child processes.

The orchestrator and every producer/consumer process read the same file, so a process restarted
by the monkey comes back with exactly the settings it died with.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

SERVICES = ("orders", "points", "logistics", "cart", "tracking", "bank", "ledger")
"""One database per service, as in a real deployment (the sample's OrderSampleSettings); tracking
is the ordered stream's orderly consumer (:mod:`benchmarks.chaos.tracking`); bank (the outbox's
writers) and ledger (its consumers) are the outbox stream (:mod:`benchmarks.chaos.outbox_stream`)."""
STREAMS = ("orders", "outbox")
"""``orders``: the order sample with half messages and its ordered events; ``outbox``: transfers
through the transactional outbox."""


class ChaosSettings(BaseModel):
    """Sizes, fault rates and timings of a chaos run (``txmsg chaos --help`` explains each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workdir: Path
    backend: str = "rocketmq"
    """The services' txmsg backend: ``rocketmq`` (remoting, ``name_server``) or ``rocketmq5``
    (the 5.x client over gRPC, ``endpoints``)."""
    name_server: str = ""
    endpoints: str = ""
    """``rocketmq5``: the broker's gRPC endpoint (fixed across restarts, as its other ports)."""
    database_urls: dict[str, str] = Field(default_factory=dict)
    """service -> SQLAlchemy URL (SQLite file, or PostgreSQL with a per-service search_path)."""
    producers: int = Field(default=3, ge=1)
    consumers_per_service: int = Field(default=2, ge=1)
    producer_threads: int = Field(default=2, ge=1)
    pay_interval: float = Field(default=0.05, ge=0)
    """Pause between two payments of one producer thread."""
    fail_rate: float = Field(default=0.1, ge=0, le=1)
    """Orders whose local transaction raises (rolled back, never delivered)."""
    slow_rate: float = Field(default=0.1, ge=0, le=1)
    """Orders whose local transaction takes ``slow_seconds`` (longer than ``answer_within``)."""
    slow_seconds: tuple[float, float] = (0.8, 2.5)
    stuck_every: int = Field(default=20, ge=0)
    """Every ``stuck_every``-th order of a paying thread (0: none) has a local transaction that
    takes ``stuck_seconds``: longer than the broker's check horizon (``benchmarks.chaos.run.
    BROKER_SETTINGS``: about 5 s), so the broker checks it back UNKNOW ``check_max`` times and
    discards it, then it commits: only txmsg's rescuer (issue 39) delivers it."""
    stuck_seconds: tuple[float, float] = (6.5, 8.0)
    answer_within: float = Field(default=0.5, gt=0)
    """The listener answers UNKNOW after this long; the check-back then reads the record."""
    grace_period: float = Field(default=3.0, ge=0)
    in_flight_timeout: float = Field(default=10.0, gt=0)
    """An IN_FLIGHT record untouched this long belongs to a dead producer: fenced and rolled back.
    Longer than the slowest local transaction (the stuck ones too), so none is fenced while it
    runs; longer than the broker's check horizon too, so a dead producer's transactions are
    discarded first and settled by the rescuer's ``check_local`` (issue 39)."""
    seed: int = 0
    streams: tuple[str, ...] = ("orders",)
    """What the run drives (:data:`STREAMS`)."""
    outbox_writers: int = Field(default=2, ge=1)
    """Bank-service processes writing transfers through the outbox (writer 0 runs the relay)."""
    outbox_relays: int = Field(default=1, ge=0)
    """``txmsg outbox relay`` processes besides writer 0's in-process relay."""
    outbox_threads: int = Field(default=2, ge=1)
    transfer_interval: float = Field(default=0.05, ge=0)
    """Pause between two transfers of one writer thread."""

    @property
    def path(self) -> Path:
        return self.workdir / "chaos.json"

    def save(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.model_dump_json(indent=2))
        return self.path

    @classmethod
    def load(cls, path: str | Path) -> ChaosSettings:
        return cls.model_validate_json(Path(path).read_text())

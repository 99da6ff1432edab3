"""The application ``benchmarks.outbox_throughput`` runs ``txmsg outbox relay --app
benchmarks._outbox_relay_app:app`` on: one outbox, with the benchmark's database and group,
declared ``relay=False`` as a writer-only service would declare it (the command runs the relay).

``OUTBOX_BENCH_DB`` (URL), ``OUTBOX_BENCH_SCHEMA`` (PostgreSQL schema, optional),
``OUTBOX_BENCH_GROUP``, ``OUTBOX_BENCH_NAMESRV``, ``OUTBOX_BENCH_LOGS`` (librocketmq's log dir).
"""

from __future__ import annotations

import os
from typing import Any

from txmsg import TxMsg, TxMsgConfig
from txmsg.sqla import create_engine, make_session_factory

_env = os.environ
_options: dict[str, Any] = {}
if _env.get("OUTBOX_BENCH_SCHEMA"):
    _options["connect_args"] = {"options": f"-csearch_path={_env['OUTBOX_BENCH_SCHEMA']}"}
engine = create_engine(_env["OUTBOX_BENCH_DB"], **_options)
Session = make_session_factory(engine)

app = TxMsg(
    TxMsgConfig(
        name_server=_env["OUTBOX_BENCH_NAMESRV"],
        client_log_dir=_env["OUTBOX_BENCH_LOGS"],
        instance_prefix=f"obr{os.getpid()}",
    ),
    backend="rocketmq",
)
outbox = app.add_outbox(group=_env["OUTBOX_BENCH_GROUP"], session_factory=Session, relay=False)

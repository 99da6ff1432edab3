"""The application module the CLI tests and the relay process load with ``--app``: one outbox
whose database, group and retry policy come from the environment, its configuration from
``TXMSG_*`` (``load_config()``).

``OUTBOX_APP_DB`` (URL), ``OUTBOX_APP_SCHEMA`` (PostgreSQL schema, optional), ``OUTBOX_APP_GROUP``,
``OUTBOX_APP_RELAY=1`` (relay in the app's process), ``OUTBOX_APP_ATTEMPTS`` (max attempts).
"""

from __future__ import annotations

import os
from typing import Any

from txmsg import TxMsg, load_config
from txmsg.sqla import create_engine, make_session_factory
from txmsg.sqla.outbox import OutboxDeadEvent, RetryPolicy

_options: dict[str, Any] = {}
if os.environ.get("OUTBOX_APP_SCHEMA"):
    _options["connect_args"] = {"options": f"-csearch_path={os.environ['OUTBOX_APP_SCHEMA']}"}
engine = create_engine(os.environ["OUTBOX_APP_DB"], **_options)
Session = make_session_factory(engine)

app = TxMsg(load_config())
outbox = app.add_outbox(
    group=os.environ["OUTBOX_APP_GROUP"],
    session_factory=Session,
    relay=os.environ.get("OUTBOX_APP_RELAY") == "1",
    retry=RetryPolicy(
        max_attempts=int(os.environ.get("OUTBOX_APP_ATTEMPTS", "16")),
        first_delay=0.1,
        max_delay=0.5,
    ),
    poll_interval=0.2,
)
dead: list[OutboxDeadEvent] = []
app.on_outbox_dead(dead.append)


def create_app() -> TxMsg:
    return app

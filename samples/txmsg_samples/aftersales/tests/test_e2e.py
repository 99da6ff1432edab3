"""The after-sales story end to end on the embedded broker, on every installed backend.

Twelve orders go through decide -> refund -> close; one order's liability names a merchant
without a settlement account (the poison).  The orderly listener retries it, parks the order with
its later events, calls the alert hook, and keeps serving the other orders - including those in
the same queue.  After the account is opened, ``txmsg parked retry`` applies the parked events
in order, exactly once, and the order flows live again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from txmsg_broker.testing import create_group, create_topic, wait_until

from txmsg import TxMsg, TxMsgConfig
from txmsg.sqla import parking
from txmsg_samples.aftersales import settlement
from txmsg_samples.aftersales.app import (
    ParkedAlerts,
    aftersales_app,
    aftersales_service,
    settlement_app,
)
from txmsg_samples.aftersales.events import KINDS, PRODUCER_GROUP, TOPIC, AfterSalesEvent
from txmsg_samples.aftersales.settings import AfterSalesSettings
from txmsg_samples.aftersales.tests.conftest import CONNECT, Dbs
from txmsg_samples.aftersales.tests.scenario import (
    NEW_MERCHANT,
    ORDERS,
    POISONED,
    QueueRecorder,
    applied_seq,
    assert_applied_once_in_order,
    open_accounts,
    others_done,
    run_cases,
)


@contextmanager
def relaying(app: TxMsg) -> Iterator[QueueRecorder]:
    """Run the started ``app``'s outbox relay over a :class:`QueueRecorder` until the block ends
    (before the app closes its producer)."""
    outbox = app.outboxes[PRODUCER_GROUP]
    recorder = QueueRecorder(app.producer(PRODUCER_GROUP))
    outbox.start_relay(recorder)
    try:
        yield recorder
    finally:
        outbox.stop_relay()


def write_config(path: Path, backend: str, connect: dict[str, Any], dbs: Dbs, alerts: Path) -> Path:
    """The sample's txmsg.toml for this broker and these databases (what `--app` reads)."""
    lines = [f'backend = "{backend}"']
    lines += [f'{key} = "{value}"' for key, value in connect.items()]
    lines += [
        "[aftersales]",
        f'cases_db = "{dbs.cases_url}"',
        f'settlement_db = "{dbs.settlement_url}"',
        f'alerts_file = "{alerts}"',
        "max_orderly_retries = 3",
        "orderly_retry_delay = 0.1",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def parked_cli(config_file: Path, *args: str) -> Result:
    """`txmsg parked ARGS --app txmsg_samples.aftersales.app:create_app` as an operator runs it, with
    the sample's config file pointing at this test's broker and databases."""
    from txmsg.cli import main  # noqa: PLC0415 - the CLI only where the test uses it

    return CliRunner().invoke(
        main,
        ["parked", args[0], "--app", "txmsg_samples.aftersales.app:create_app", *args[1:]],
        env={"TXMSG_CONFIG": str(config_file)},
        catch_exceptions=False,
    )


def replay_with_cli(config_file: Path, key: str) -> None:
    """`txmsg parked retry ... --group aftersales-settlement --key KEY`: all three released."""
    result = parked_cli(config_file, "retry", "--group", settlement.GROUP, "--key", key)
    assert result.exit_code == 0, result.output
    assert f"{settlement.GROUP}  key={key!r}: replayed 3, released" in result.output


def test_poisoned_order_parks_alone_and_replays_in_order_once(
    backend_name: str, broker: Any, dbs: Dbs, tmp_path: Path
) -> None:
    create_topic(broker.namesrv_addr, TOPIC, queues=2, message_type="FIFO")
    create_group(broker.namesrv_addr, settlement.GROUP, orderly=True)  # RocketMQ 5: FIFO pops
    connect = CONNECT[backend_name](broker, tmp_path)
    config = TxMsgConfig(backend=backend_name, **connect)
    alerts_file = tmp_path / "alerts.jsonl"
    config_file = write_config(tmp_path / "txmsg.toml", backend_name, connect, dbs, alerts_file)
    settings = AfterSalesSettings(
        cases_db=dbs.cases_url,
        settlement_db=dbs.settlement_url,
        alerts_file=str(alerts_file),
        orderly_retry_delay=0.1,
    )
    open_accounts(dbs.settlement)
    alerts = ParkedAlerts(settings.alerts_file)
    # the after-sales service's relay sends through a recorder of the queues (started by hand)
    pub = aftersales_app(config, dbs.cases, relay=False)
    pub.add_producer(group=PRODUCER_GROUP)
    with settlement_app(config, settings, dbs.settlement, alerts), pub, relaying(pub) as sender:
        service = aftersales_service(pub, dbs.cases)
        run_cases(service)

        def parked_behind() -> int:
            return len(parking.parked_messages(dbs.settlement, settlement.GROUP, POISONED))

        wait_until(
            lambda: others_done(dbs.settlement) and parked_behind() == len(KINDS),
            timeout=90,
            message=lambda: (
                f"the other orders to complete ({applied_seq(dbs.settlement)}) and "
                f"{POISONED} to be parked with its events ({parked_behind()} parked)"
            ),
        )
        # the poisoned order's queue carried other orders too, and they completed
        (queue,) = sender.queues[POISONED]  # one key, one queue
        assert queue is not None, "the backend did not report the queue (SendResult.queue_id)"
        neighbours = [o for o in ORDERS if o != POISONED and sender.queues[o] == {queue}]
        assert neighbours, f"no other order shared queue {queue}: {dict(sender.queues)}"
        assert all(applied_seq(dbs.settlement)[o] == len(KINDS) for o in neighbours)

        # parked: the failed event first, then the ones behind it, in the order they were sent
        parked = parking.parked_messages(dbs.settlement, settlement.GROUP, POISONED)
        events = [AfterSalesEvent.from_body(p.message.body) for p in parked]
        assert [(e.seq, e.kind) for e in events] == list(enumerate(KINDS, start=1))
        assert parked[0].attempts == 3
        assert "UnknownMerchant" in (parked[0].error or "")
        assert POISONED not in applied_seq(dbs.settlement)  # nothing of it applied
        (key,) = parking.parked_keys(dbs.settlement, settlement.GROUP)
        assert (key.sharding_key, key.messages) == (POISONED, len(KINDS))

        # the alert hook: called once, with what an operator needs
        (event,) = alerts.events
        assert (event.group, event.topic, event.sharding_key, event.attempts) == (
            settlement.GROUP,
            TOPIC,
            POISONED,
            3,
        )
        assert f"merchant {NEW_MERCHANT} has no settlement account" in event.error
        (line,) = alerts_file.read_text().splitlines()
        assert json.loads(line)["sharding_key"] == POISONED

        # what an operator sees; a replay before the fix fails again and keeps the order parked
        listed = parked_cli(config_file, "list", "--json")
        assert listed.exit_code == 0, listed.output
        (shown,) = json.loads(listed.output)
        assert (shown["group"], shown["sharding_key"]) == (settlement.GROUP, POISONED)
        early = parked_cli(config_file, "retry", "--group", settlement.GROUP, "--key", POISONED)
        assert early.exit_code == 1, early.output
        assert "stays parked" in early.output
        assert len(parking.parked_messages(dbs.settlement, settlement.GROUP, POISONED)) == 3

        # the fix, then the replay through the CLI, as an operator runs it
        with dbs.settlement() as s, s.begin():
            settlement.open_account(s, NEW_MERCHANT)
        replay_with_cli(config_file, POISONED)
        assert applied_seq(dbs.settlement)[POISONED] == len(KINDS)
        assert parking.parked_keys(dbs.settlement) == []
        nothing = parked_cli(config_file, "retry", "--group", settlement.GROUP)
        assert (nothing.exit_code, nothing.output.strip()) == (0, "nothing parked")

        # released: the order's new events are consumed live again
        service.open_case("c-again", POISONED, NEW_MERCHANT, 300)
        service.decide_liability("c-again", "platform")
        service.pay_refund("c-again", "pay-again")
        wait_until(
            lambda: applied_seq(dbs.settlement).get(POISONED) == 2 * len(KINDS) - 1,
            timeout=60,
            message="the released order's new events to be applied live",
        )
        assert len(alerts.events) == 1
    assert_applied_once_in_order(dbs.cases, dbs.settlement)

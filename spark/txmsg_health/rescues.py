"""What txmsg's rescuer did with a group's discarded half messages, from the service's metrics.

Why: a broker that gives up on a transaction (``transactionCheckMax`` check-backs) moves its half
message to ``TRANS_CHECK_MAX_TIME_TOPIC``, and its log says so (the job's ``discards`` rule). A
txmsg service rescues those messages by default (``txmsg.rescue``; docs/guide/discards.md), which
the broker's logs cannot show: the rescue happens in the service. The service counts what it did
in the metric ``txmsg.discards`` by outcome; given that metric's Prometheus exposition (a saved
scrape or a service's ``/metrics`` URL, ``--rescue-metrics``), the discard finding says per group
how many were sent again, rolled back, put back for another horizon, or given up.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from txmsg_health.inputs import HealthInputError

METRIC = "txmsg_discards"
"""The Prometheus name of ``txmsg.discards`` (the OpenTelemetry exporter's; tests/otel pins it),
without the counter's ``_total``."""
GROUP_LABEL = "txmsg_producer_group"
OUTCOME_LABEL = "txmsg_discard_outcome"
OUTCOMES = ("rescued", "rolled_back", "retried", "dead")
"""As ``txmsg.otel.names.DISCARD_OUTCOMES`` (the job does not import txmsg: it runs on Spark
alone)."""

Counts = dict[str, dict[str, int]]


def parse(text: str) -> Counts:
    """Outcome counts per producer group in one Prometheus text exposition (several scrapes of one
    group, from several instances of a service, add up in :func:`read`)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    counts: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for family in text_string_to_metric_families(text):
        if family.name not in (METRIC, METRIC + "_total"):
            continue
        for sample in family.samples:
            if sample.name != METRIC + "_total":
                continue  # _created
            group = sample.labels.get(GROUP_LABEL)
            outcome = sample.labels.get(OUTCOME_LABEL)
            if group and outcome in OUTCOMES:
                counts[group][outcome] += int(sample.value)
    return {g: dict(c) for g, c in counts.items()}


def read(sources: Iterable[str]) -> Counts | None:
    """The counts of every source (a file or an http(s) URL), summed; None when none is given."""
    sources = list(sources)
    if not sources:
        return None
    total: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for source in sources:
        for group, by_outcome in parse(_text(source)).items():
            for outcome, n in by_outcome.items():
                total[group][outcome] += n
    return {g: dict(c) for g, c in total.items()}


def _text(source: str) -> str:
    what = (
        "pass a saved scrape of a txmsg service (Prometheus text format) or its /metrics URL "
        "(docs/guide/observability.md)"
    )
    try:
        if source.startswith(("http://", "https://")):
            with urllib.request.urlopen(source, timeout=10) as response:  # noqa: S310 - http(s) only
                return str(response.read().decode("utf-8", errors="replace"))
        with open(source, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (OSError, urllib.error.URLError) as exc:
        raise HealthInputError(
            f"--rescue-metrics {source}: cannot read it ({exc}); {what}"
        ) from exc


def text(rescue: Mapping[str, int] | None, measured: bool) -> str:
    """The words the discard finding ends with (``rules.evaluate``)."""
    if not measured:
        return (
            "; whether txmsg's rescuer sent them again is in the service's metrics "
            "(--rescue-metrics; docs/guide/discards.md)"
        )
    if not rescue or not any(rescue.values()):
        return (
            "; the service's metrics count no rescue for this group: unless another rescuer "
            "handled them, committed ones among them were never delivered (txmsg rescues them "
            "unless rescue_discarded=False; docs/guide/discards.md)"
        )
    n = {k: rescue.get(k, 0) for k in OUTCOMES}
    dead = (
        f", {n['dead']} given up (`txmsg discarded list --group <group>`)"
        if n["dead"]
        else ", none given up"
    )
    return (
        f"; txmsg's rescuer, by the service's metrics: {n['rescued']} sent again, "
        f"{n['rolled_back']} rolled back, {n['retried']} put back for another check horizon{dead}"
    )


def annotate(result: dict[str, Any], counts: Counts | None) -> None:
    """Give every group with discards its ``rescue`` (outcome counts, or None without metrics)
    and end its discard finding (the ``discards:`` reason, also where a broker's name leads it)
    with what the rescuer did (:func:`text`). The counts are per group: the service's metric
    does not say which broker a discard came from."""
    for group, g in result.get("groups", {}).items():
        if not g.get("discarded"):
            continue
        g["rescue"] = None if counts is None else dict(counts.get(group, {}))
        suffix = text(g["rescue"], counts is not None)
        g["reasons"] = [r + suffix if _is_discards(r) else r for r in g.get("reasons", [])]


def _is_discards(reason: str) -> bool:
    """``discards: ...`` or ``<broker>: discards: ...`` (``summary._with_brokers``)."""
    return reason.startswith("discards: ") or ": discards: " in reason.split("(", 1)[0]

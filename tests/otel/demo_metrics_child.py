"""Child process of test_dashboard.py: ``txmsg demo``'s run with ``metrics_port=0``, scraped.

Runs the order demo on its own embedded broker with the Prometheus endpoint on, scrapes
``/metrics`` every half second while it runs (a name counts once any scrape showed it), and
prints ``SCRAPED <name>`` per metric sample name and ``LABEL <name>`` per label name, then
``EXIT <code>``.  The demo has no orderly
listener and no outbox, so the parked-key and outbox sources are registered with txmsg's own
gauge API (one group each, figures 0): those instruments are exported by the same exporter, under
the names a dashboard must use.  A child process, because the global meter provider can be set
once per process (the test worker has the in-memory SDK)."""

from __future__ import annotations

import io
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

from rich.console import Console
from txmsg_samples.order.demo import DemoOptions, run

from txmsg.otel import gauges

workdir = Path(sys.argv[1])
console_out = io.StringIO()
options = DemoOptions(
    orders=20,
    fail_rate=0.2,
    slow_rate=0.3,
    lose_ack_rate=0.1,
    seed=5,
    threads=4,
    timeout=90.0,
    workdir=workdir,
    metrics_port=0,
)
result: list[int] = []
runner = threading.Thread(
    target=lambda: result.append(run(options, Console(file=console_out, width=200)))
)
runner.start()
names: set[str] = set()
labels: set[str] = set()
sample = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", re.MULTILINE)
label = re.compile(r"[{,]([a-zA-Z_][a-zA-Z0-9_]*)=\"")
registered = False
while runner.is_alive():
    time.sleep(0.5)
    found = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", console_out.getvalue())
    if found is None:
        continue
    if not registered:
        gauges.watch_parked_keys("demo-orderly-group", lambda: 0)
        gauges.watch_outbox("demo-outbox-group", lambda: (0, None))
        registered = True
    try:
        with urllib.request.urlopen(found.group(1), timeout=5) as reply:  # noqa: S310 - our own endpoint
            text = reply.read().decode()
    except OSError:
        continue  # closing at the end of the run
    names.update(sample.findall(text))
    labels.update(label.findall(text))
runner.join()
print(console_out.getvalue(), file=sys.stderr)
for name in sorted(names):
    print("SCRAPED", name)
for name in sorted(labels):
    print("LABEL", name)
print("EXIT", result[0] if result else "none")

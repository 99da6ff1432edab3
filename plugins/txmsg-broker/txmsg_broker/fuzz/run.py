"""Long fuzz mode for the embedded broker: decoders in process, then a live broker's sockets.

    python -m benchmarks.fuzz_broker --inputs 1000000 [--socket-inputs 20000] [--seed 1]
                                     [--seconds S] [--engine auto|atheris|mutate] [--workers 4]

(``python -m txmsg_broker.fuzz`` is the same; the harness lives with the broker it fuzzes, and
``benchmarks.fuzz_broker`` is the benchmark table's thin wrapper.)

Phase 1 (in process, ``--inputs``): inputs for the frame decoder (``RemotingCommand.decode`` incl.
header parsing, typed ext access and the re-encode round trip), the server's framing loop, message
records, batch bodies and properties (``txmsg_broker.fuzz.inputs`` lists the targets and what each may
raise). With ``atheris`` importable (the ``dev`` extra installs it) the run is coverage-guided: a child
process instruments ``txmsg_broker`` and libFuzzer drives the structured generators through
``FuzzedDataProvider`` (``atheris.Fuzz`` never returns, so the child writes its counts to a file and
exits itself). Otherwise a seeded mutational fuzzer drives the same generators. Only ``DecodeError``
and ``MessageDecodeError`` are acceptable; anything else is printed with the input in hex.

Phase 2 (``--socket-inputs``): a child-process broker; ``--workers`` threads each open one connection
per input to the broker port (4 in 5) or the name server port, write a fuzzed frame, and check the
answer (``txmsg_broker.fuzz.live``), while a well-behaved client keeps sending messages on its own
connection - each send must succeed. Then every acknowledged message is pulled back (CRC checked),
the broker is restarted (commit log re-verified on start) and everything is pulled back again.

``--seconds`` caps each phase. Exit status 1 on any finding. Last line::

    RESULT fuzz_broker inputs=<n> socket_inputs=<m> crashes=0 hangs=0 stored_ok=<k>/<k> ratio=<k/k>
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txmsg_broker.acl_config import write_acl
from txmsg_broker.app import BrokerProcess

from .inputs import (
    FUZZ_ACL,
    FUZZ_CREDENTIALS,
    FdpChooser,
    RandomChooser,
    frame,
    generate,
    run_target,
)
from .live import GoodSender, exchange, healthy, log_findings, problems, read_back

MAX_FINDINGS = 20  # distinct findings kept (by target, exception type and raising line)


@dataclass
class Stats:
    """Counts of one in-process run; a JSON round trip carries it out of the atheris child."""

    inputs: int = 0
    seconds: float = 0.0
    labels: collections.Counter[str] = field(default_factory=collections.Counter)
    findings: list[dict[str, str]] = field(default_factory=list)
    finding_count: int = 0
    hangs: int = 0
    engine: str = "mutate"

    def run(self, target: str, data: bytes) -> None:
        self.inputs += 1
        try:
            label = run_target(target, data)
        except Exception as exc:  # noqa: BLE001 - every undocumented exception is a finding
            label = "FINDING " + type(exc).__name__
            self.add_finding(target, data, exc)
        self.labels[f"{target}: {label}"] += 1

    def add_finding(self, target: str, data: bytes, exc: BaseException) -> None:
        self.finding_count += 1
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        key = (target, type(exc).__name__, where)
        if len(self.findings) < MAX_FINDINGS and all(
            (f["target"], f["error"], f["where"]) != key for f in self.findings
        ):
            self.findings.append(
                {
                    "target": target,
                    "error": type(exc).__name__,
                    "where": where,
                    "message": str(exc)[:300],
                    "hex": data.hex(),
                }
            )

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "labels": dict(self.labels)})

    @classmethod
    def from_json(cls, text: str) -> Stats:
        raw = json.loads(text)
        raw["labels"] = collections.Counter(raw["labels"])
        return cls(**raw)


class Watchdog(threading.Thread):
    """Declares a hang when the input counter stops moving; prints the input and ends the process."""

    def __init__(self, stats: Stats, limit: float, on_hang: Any) -> None:
        super().__init__(name="fuzz-watchdog", daemon=True)
        self.stats, self.limit, self.on_hang = stats, limit, on_hang
        self.current: tuple[str, bytes] = ("", b"")
        self.done = threading.Event()

    def run(self) -> None:
        last, since = -1, time.monotonic()
        while not self.done.wait(1.0):
            if self.stats.inputs != last:
                last, since = self.stats.inputs, time.monotonic()
            elif time.monotonic() - since > self.limit:
                target, data = self.current
                self.stats.hangs += 1
                self.stats.findings.append(
                    {
                        "target": target,
                        "error": "Hang",
                        "where": "?",
                        "message": f"no progress for {self.limit:.0f} s",
                        "hex": data.hex(),
                    }
                )
                self.on_hang()
                os._exit(3)


# --- phase 1: mutational engine ------------------------------------------------------------------
def run_mutate(inputs: int, seed: int, seconds: float | None, hang_seconds: float) -> Stats:
    stats = Stats(engine="mutate")
    watchdog = Watchdog(stats, hang_seconds, lambda: _report_hang(stats))
    watchdog.start()
    ch = RandomChooser(random.Random(seed))
    started = time.monotonic()
    stop_at = started + seconds if seconds else float("inf")
    while stats.inputs < inputs:
        target, data = generate(ch)
        watchdog.current = (target, data)
        stats.run(target, data)
        if stats.inputs % 1024 == 0:
            if time.monotonic() > stop_at:
                break
            if stats.inputs % 100_000 == 0:
                _progress(stats, started)
    watchdog.done.set()
    stats.seconds = time.monotonic() - started
    return stats


def _progress(stats: Stats, started: float) -> None:
    elapsed = time.monotonic() - started
    print(
        f"  {stats.inputs} inputs, {elapsed:.0f} s, {stats.inputs / elapsed:.0f}/s, "
        f"{stats.finding_count} findings",
        file=sys.stderr,
        flush=True,
    )


def _report_hang(stats: Stats) -> None:
    _print_findings(stats.findings)
    print(
        f"RESULT fuzz_broker inputs={stats.inputs} socket_inputs=0 crashes={stats.finding_count} "
        f"hangs={stats.hangs} stored_ok=0/0 ratio=0.0",
        flush=True,
    )


# --- phase 1: atheris engine (child process) ------------------------------------------------------
def atheris_available() -> bool:
    return importlib.util.find_spec("atheris") is not None


#: The atheris child's program: it instruments ``txmsg_broker`` *before* anything imports it (this
#: module lives inside the package, so ``-m txmsg_broker.fuzz`` would import it uninstrumented and
#: libFuzzer would see no coverage), and leaves the harness itself (``txmsg_broker.fuzz``) out.
ATHERIS_BOOT = """\
import sys
import atheris
with atheris.instrument_imports(include=["txmsg_broker"], exclude=["txmsg_broker.fuzz"]):
    import txmsg_broker.codec, txmsg_broker.message_codec, txmsg_broker.transport, txmsg_broker.acl
from txmsg_broker.fuzz.run import main
sys.exit(main(sys.argv[1:]))
"""


def run_atheris(inputs: int, seed: int, seconds: float | None, hang_seconds: float) -> Stats:
    """Run the coverage-guided child and collect its counts."""
    workdir = Path(tempfile.mkdtemp(prefix="txmsg-atheris-"))
    stats_path = workdir / "stats.json"
    cmd = [
        sys.executable,
        "-c",
        ATHERIS_BOOT,
        "--atheris-child",
        str(stats_path),
        "--inputs",
        str(inputs),
        "--seed",
        str(seed),
        "--hang-seconds",
        str(hang_seconds),
    ]
    if seconds:
        cmd += ["--seconds", str(seconds)]
    with open(workdir / "libfuzzer.log", "wb") as log:
        proc = subprocess.run(  # noqa: S603 - this interpreter, our boot script and our options
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, check=False
        )
    if stats_path.exists():
        stats = Stats.from_json(stats_path.read_text())
        if proc.returncode == 0 and not stats.finding_count:
            shutil.rmtree(workdir, ignore_errors=True)
        return stats
    # the child died without writing its counts: a native crash, or libFuzzer's own timeout
    tail = (workdir / "libfuzzer.log").read_text(errors="replace").splitlines()[-30:]
    stats = Stats(engine="atheris", finding_count=1)
    stats.findings.append(
        {
            "target": "?",
            "error": f"child exit {proc.returncode}",
            "where": str(workdir),
            "message": "\n".join(tail),
            "hex": "",
        }
    )
    return stats


def atheris_child(
    stats_path: Path, inputs: int, seed: int, seconds: float | None, hang_seconds: float
) -> None:
    """The libFuzzer loop; started through :data:`ATHERIS_BOOT`, which instrumented the broker."""
    atheris: Any = importlib.import_module("atheris")  # optional, untyped (dev extra, Linux x86_64)

    stats = Stats(engine="atheris")
    started = time.monotonic()
    stop_at = started + seconds if seconds else float("inf")

    def finish(code: int) -> None:
        stats.seconds = time.monotonic() - started
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(stats.to_json())
        tmp.replace(stats_path)
        sys.stdout.flush()
        os._exit(code)

    watchdog = Watchdog(stats, hang_seconds, lambda: finish(3))
    watchdog.start()

    def test_one_input(data: bytes) -> None:
        target, payload = generate(FdpChooser(atheris.FuzzedDataProvider(data)))
        watchdog.current = (target, payload)
        stats.run(target, payload)
        if stats.inputs >= inputs or (stats.inputs % 1024 == 0 and time.monotonic() > stop_at):
            finish(0)
        if stats.inputs % 100_000 == 0:
            _progress(stats, started)

    atheris.Setup(
        [
            "txmsg-fuzz-broker",
            f"-seed={seed}",
            "-max_len=8192",
            f"-timeout={int(hang_seconds) + 5}",
            f"-artifact_prefix={stats_path.parent}/",
            "-print_final_stats=0",
            "-rss_limit_mb=4096",
        ],
        test_one_input,
    )
    atheris.Fuzz()


# --- phase 2: live broker sockets ---------------------------------------------------------------
@dataclass
class SocketStats:
    inputs: int = 0
    seconds: float = 0.0
    probes_answered: int = 0
    crashes: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    good_sent: int = 0
    good_attempts: int = 0
    stored_ok: int = 0
    notes: list[str] = field(default_factory=list)


def run_sockets(
    inputs: int,
    seed: int,
    seconds: float | None,
    workers: int,
    deadline: float,
    keep: bool,
    acl: bool = False,
) -> SocketStats:
    """``acl``: the broker enforces FUZZ_ACL; the good client, probes and checks sign with its admin keys."""
    base = Path(tempfile.mkdtemp(prefix="txmsg-fuzz-broker-"))
    settings: dict[str, Any] = {"acl": write_acl(base / "plain_acl.yml", FUZZ_ACL)} if acl else {}
    credentials = FUZZ_CREDENTIALS if acl else None
    broker = BrokerProcess(base / "data", base / "logs", **settings).start()
    result = SocketStats()
    good = GoodSender(broker.broker_addr, credentials=credentials)
    try:
        good.start()
        _fuzz_sockets(broker, good, result, inputs, seed, seconds, workers, deadline, credentials)
        good.stop()
        _verify_store(broker, good, result, credentials)
    finally:
        good.stop()
        broker.kill()  # no-op after a clean stop; never leave a broker behind (it has its own session)
    result.crashes += log_findings(base / "logs")
    if keep or result.crashes or result.hangs:
        result.notes.append(f"broker data and logs kept in {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return result


def _fuzz_sockets(
    broker: Any,
    good: Any,
    result: SocketStats,
    inputs: int,
    seed: int,
    seconds: float | None,
    workers: int,
    deadline: float,
    credentials: tuple[str, str] | None = None,
) -> None:
    """``workers`` threads, one connection per input, each input reproducible from (seed, index)."""
    lock = threading.Lock()
    next_index = iter(range(inputs))
    started = time.monotonic()
    stop_at = started + seconds if seconds else float("inf")

    def worker() -> None:
        while time.monotonic() < stop_at:
            with lock:
                index = next(next_index, None)
            if index is None:
                return
            rng = random.Random(seed * 1_000_003 + index)
            addr = broker.namesrv_addr if rng.randrange(5) == 0 else broker.broker_addr
            data = frame(RandomChooser(rng))
            outcome = None
            try:
                outcome = exchange(addr, data, deadline=deadline, credentials=credentials)
                found = problems(data, outcome)
            except OSError as exc:  # cannot even connect: the broker is gone or refuses
                found = [f"connect failed: {exc!r}"]
            except Exception as exc:  # noqa: BLE001 - a harness error must not end the run silently
                found = [f"harness error: {exc!r}"]
            with lock:
                result.inputs += 1
                if outcome is not None and outcome.probe_answered:
                    result.probes_answered += 1
                for text in found:
                    bucket = (
                        result.hangs
                        if text.startswith(("hang", "the connection stopped"))
                        else result.crashes
                    )
                    bucket.append(
                        f"{text}\n    input #{index} to {addr} ({len(data)} bytes): {data.hex()}"
                    )
                if result.inputs % 5000 == 0:
                    elapsed = time.monotonic() - started
                    print(
                        f"  {result.inputs} socket inputs, {elapsed:.0f} s, {result.inputs / elapsed:.0f}/s, "
                        f"good sends {len(good.sent)}",
                        file=sys.stderr,
                        flush=True,
                    )

    threads = [threading.Thread(target=worker, name=f"fuzz-socket-{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.monotonic() - started


def _verify_store(
    broker: Any, good: Any, result: SocketStats, credentials: tuple[str, str] | None = None
) -> None:
    """The well-behaved client's messages: all acknowledged, all read back, also after a restart."""
    result.good_sent, result.good_attempts = len(good.sent), good.attempts
    result.crashes += [f"well-behaved client: {text}" for text in good.failures]
    if not broker.running:
        result.crashes.append(
            f"the broker process died (exit {broker.proc.returncode if broker.proc else '?'})"
        )
        return
    try:
        result.crashes += [
            f"after the fuzzing: {text}"
            for text in healthy(broker.namesrv_addr, broker.broker_addr, credentials=credentials)
        ]
        before = read_back(broker.broker_addr, good.topic, credentials=credentials)
        exit_code = broker.stop()
        if exit_code != 0:
            result.crashes.append(f"the broker's clean shutdown exited with {exit_code}")
        broker.start()  # recovery re-verifies every commit-log record (magic, size, CRC)
        after = read_back(broker.broker_addr, good.topic, credentials=credentials)
        result.stored_ok = sum(
            1
            for body, queue_id in good.sent.items()
            if before.get(body) == queue_id and after.get(body) == queue_id
        )
        result.notes.append(f"read back {len(before)} before and {len(after)} after a restart")
        broker.stop()
    except Exception as exc:  # noqa: BLE001 - reported, and the RESULT line still printed
        result.crashes.append(f"verifying the stored messages failed: {exc!r}")


# --- report ---------------------------------------------------------------------------------------
def _print_findings(findings: list[dict[str, str]]) -> None:
    for f in findings:
        print(f"FINDING {f['target']}: {f['error']} at {f['where']}: {f['message']}")
        if f["hex"]:
            print(f"  input ({len(f['hex']) // 2} bytes): {f['hex']}")
            shown = f["hex"] if len(f["hex"]) <= 256 else "<the input above>"
            print(
                f'  reproduce: python -c "from txmsg_broker.fuzz.inputs import run_target; '
                f"print(run_target('{f['target']}', bytes.fromhex('{shown}')))\""
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1_000_000, help="in-process inputs (phase 1)")
    parser.add_argument(
        "--socket-inputs", type=int, default=20_000, help="live broker inputs (phase 2)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--seconds", type=float, default=None, help="cap each phase at this many seconds"
    )
    parser.add_argument("--engine", choices=("auto", "atheris", "mutate"), default="auto")
    parser.add_argument(
        "--workers", type=int, default=4, help="concurrent fuzz connections (phase 2)"
    )
    parser.add_argument(
        "--deadline", type=float, default=10.0, help="seconds before a connection is a hang"
    )
    parser.add_argument(
        "--hang-seconds", type=float, default=20.0, help="in-process hang threshold"
    )
    parser.add_argument("--keep", action="store_true", help="keep the broker's data and logs")
    parser.add_argument(
        "--acl",
        action="store_true",
        help="phase 2 against a broker with ACL on (inputs.FUZZ_ACL); the well-behaved "
        "client and the probes sign with its admin keys, a third of the inputs too",
    )
    parser.add_argument("--atheris-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.atheris_child is not None:
        atheris_child(args.atheris_child, args.inputs, args.seed, args.seconds, args.hang_seconds)
        return 0  # not reached: the child always leaves through os._exit

    engine = args.engine
    if engine == "auto":
        engine = "atheris" if atheris_available() else "mutate"
    print(
        f"phase 1: {args.inputs} in-process inputs, engine {engine}, seed {args.seed}", flush=True
    )
    runner = run_atheris if engine == "atheris" else run_mutate
    stats = runner(args.inputs, args.seed, args.seconds, args.hang_seconds)
    rate = stats.inputs / stats.seconds if stats.seconds else 0.0
    print(
        f"phase 1: {stats.inputs} inputs in {stats.seconds:.1f} s ({rate:.0f} inputs/s), "
        f"{stats.finding_count} findings, {stats.hangs} hangs"
    )
    for label, count in sorted(stats.labels.items()):
        print(f"  {label:40s} {count:9d}")
    _print_findings(stats.findings)

    sockets = SocketStats()
    if args.socket_inputs > 0:
        print(
            f"phase 2: {args.socket_inputs} live socket inputs, {args.workers} workers"
            + (", ACL on" if args.acl else ""),
            flush=True,
        )
        sockets = run_sockets(
            args.socket_inputs,
            args.seed,
            args.seconds,
            args.workers,
            args.deadline,
            args.keep,
            args.acl,
        )
        srate = sockets.inputs / sockets.seconds if sockets.seconds else 0.0
        print(
            f"phase 2: {sockets.inputs} inputs in {sockets.seconds:.1f} s ({srate:.0f} inputs/s), "
            f"probe answered on {sockets.probes_answered}; well-behaved client: {sockets.good_sent} of "
            f"{sockets.good_attempts} sends acknowledged, {sockets.stored_ok} read back intact"
        )
        for note in sockets.notes:
            print(f"  {note}")
        reports = sockets.crashes + sockets.hangs
        for text in reports[:MAX_FINDINGS]:
            print(f"FINDING socket: {text}")
        if len(reports) > MAX_FINDINGS:
            print(f"... and {len(reports) - MAX_FINDINGS} more socket findings")

    crashes = stats.finding_count + len(sockets.crashes)
    hangs = stats.hangs + len(sockets.hangs)
    total = sockets.good_attempts
    ratio = sockets.stored_ok / total if total else 1.0
    print(
        f"RESULT fuzz_broker inputs={stats.inputs} socket_inputs={sockets.inputs} crashes={crashes} "
        f"hangs={hangs} stored_ok={sockets.stored_ok}/{total} ratio={round(ratio, 4)}"
    )
    failed = crashes or hangs or sockets.stored_ok != total
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

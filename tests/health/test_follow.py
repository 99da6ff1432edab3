"""`txmsg health --follow`: live mode on files appended, rotated and added while it runs.

One scenario, two runs of the real command (its own JVM, a 1 s trigger): lines are appended
(one of them in two writes), rotated files appear, one broker's live file is rotated into
``otherdays/*.log.gz`` with lines it never showed live, the first run is stopped with SIGTERM,
more lines are appended, and a restart from the checkpoint catches up. The final summary must
equal the batch job's on the same files: every line counted once.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from txmsg_broker.testing import wait_until
from txmsg_health import follow, generate, job

from txmsg.cli import main


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _total(out: Path) -> int:
    try:
        return int(json.loads((out / "summary.json").read_text())["lines"]["total"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return -1


def _count(logs: Path) -> int:
    n = 0
    for p in logs.rglob("*"):
        if p.is_file() and not p.name.startswith("."):
            data = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
            n += len(data.splitlines())
    return n


def _wait_total(out: Path, logs: Path) -> None:
    want = _count(logs)
    wait_until(
        lambda: _total(out) == want,
        timeout=150,
        interval=0.3,
        message=lambda: f"summary.json total {_total(out)} == {want} lines in {logs}",
    )


def _follow(run: Callable[[], object], drive: Callable[[], None]) -> object:
    """``run`` the follower in this (main) thread while ``drive`` runs in another, then SIGTERM it.

    The real signal goes to this process: the follower's handler must stop it cleanly.
    """
    failed: list[BaseException] = []

    def driver() -> None:
        try:
            drive()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            failed.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=driver, daemon=True)
    t.start()
    result = run()
    t.join(timeout=30)
    if failed:
        raise failed[0]
    return result


def test_follow_counts_every_line_once_across_appends_rotation_and_restart(
    spark: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    generate.generate(str(src), 6_000, groups=20, planted=4, seed=5, layout="brokers", gz=True)
    logs, out = tmp_path / "logs", tmp_path / "out"
    brokers = sorted(d.name for d in src.iterdir() if d.is_dir())
    assert len(brokers) >= 2
    parts: dict[Path, list[bytes]] = {}
    for b in brokers:
        (logs / b).mkdir(parents=True)
        for name in ("transaction.log", "broker.log"):
            lines = _lines(src / b / name)
            parts[logs / b / name] = lines
            (logs / b / name).write_bytes(b"".join(lines[: len(lines) // 2]))

    def first_run() -> None:
        _wait_total(out, logs)
        # appended while it runs, one line in two writes; rotated files appear once
        for path, lines in parts.items():
            half, three = len(lines) // 2, 3 * len(lines) // 4
            with path.open("ab") as f:
                f.write(b"".join(lines[half : three - 1]) + lines[three - 1][:10])
                f.flush()
                f.write(lines[three - 1][10:])
        for b in brokers:
            (logs / b / "otherdays").mkdir()
            shutil.copy(src / b / "otherdays" / "transaction.1.log.gz", logs / b / "otherdays")
        # one live file rotated away with lines it never showed live, and a fresh file begun
        live = logs / brokers[0] / "transaction.log"
        lines = parts.pop(live)
        three, rest = 3 * len(lines) // 4, len(lines) - (len(lines) - 3 * len(lines) // 4) // 2
        with gzip.open(logs / brokers[0] / "otherdays" / "transaction.2.log.gz", "wb") as g:
            g.write(live.read_bytes() + b"".join(lines[three:rest]))
        live.write_bytes(b"".join(lines[rest:]))
        _wait_total(out, logs)

    cfg = follow.FollowConfig(job.JobConfig(inputs=[str(logs)], out=str(out)), trigger_seconds=1.0)
    _follow(lambda: follow.follow(spark, cfg), first_run)  # type: ignore[arg-type]
    for path, lines in parts.items():  # written while nothing runs
        with path.open("ab") as f:
            f.write(b"".join(lines[3 * len(lines) // 4 :]))
    # the restart as an operator runs it: the command line (reusing the test session's Spark)
    res = _follow(
        lambda: CliRunner().invoke(
            main,
            [
                "health",
                "--follow",
                str(logs),
                "--out",
                str(out),
                "--trigger",
                "1s",
                "--master",
                "local[2]",
            ],
        ),
        lambda: _wait_total(out, logs),
    )
    assert isinstance(res, Result)
    assert res.exit_code == 0, res.output

    live_summary = json.loads((out / "summary.json").read_text())
    batch = job.run(
        spark,
        job.JobConfig(
            inputs=[str(logs)],
            out=str(tmp_path / "batch"),  # type: ignore[arg-type]
            dashboard=False,
        ),
    ).summary
    assert live_summary["lines"] == batch["lines"]
    assert live_summary["groups"] == batch["groups"]
    assert live_summary["flagged"] == batch["flagged"]
    assert live_summary["flagged"], "the generated logs plant misbehaving groups"
    text = capsys.readouterr().err + res.output
    assert text.count("stopped after") == 2
    for g in live_summary["flagged"]:
        crossed = text.count(f"group {g} crossed a threshold")
        assert crossed >= 1, text[-3000:]
        assert crossed <= 1 + text.count(f"group {g} is back under"), "logged once per crossing"
    assert os.path.islink(out / "metrics_by_window.parquet")
    read = spark.read.parquet  # type: ignore[attr-defined]
    key = ["group", "broker", "window_start"]
    assert (
        read(str(out / "metrics_by_window.parquet")).orderBy(*key).collect()
        == read(batch["parquet"]).orderBy(*key).collect()
    )
    assert (out / "dashboard.html").is_file()
    assert not [n for n in os.listdir(out) if n.startswith(".summary.")]


def _staged(t: follow.Tailer) -> bytes:
    names = sorted(os.listdir(t.staging), key=lambda n: (n.split("-")[0], n))
    return b"".join((Path(t.staging) / n).read_bytes() for n in names if not n.startswith("."))


def test_tailer_stages_complete_lines_once_through_rotation_and_a_lost_offsets_file(
    tmp_path: Path,
) -> None:
    """No Spark: the tailer alone, including a crash that lost offsets.json's last update."""
    logs, ckpt = tmp_path / "logs" / "broker-a", tmp_path / "ckpt"
    logs.mkdir(parents=True)
    live = logs / "transaction.log"
    live.write_bytes(b"line 1\nline 2\nli")
    t = follow.Tailer([str(logs.parent)], str(ckpt))
    t.poll()
    assert _staged(t) == b"line 1\nline 2\n"  # the half line waits for its newline
    saved = (ckpt / "offsets.json").read_bytes()
    with live.open("ab") as f:
        f.write(b"ne 3\n")
    t.poll()
    (ckpt / "offsets.json").write_bytes(saved)  # as if it crashed before saving: staged names win
    t = follow.Tailer([str(logs.parent)], str(ckpt))
    assert t.poll() == 0
    # rotated into otherdays/ with one line never seen live; a fresh file begins
    (logs / "otherdays").mkdir()
    with gzip.open(logs / "otherdays" / "transaction.1.log.gz", "wb") as g:
        g.write(live.read_bytes() + b"line 4")
    live.write_bytes(b"new 1\n")
    t.poll()
    t.poll()
    assert sorted(_staged(t).splitlines()) == sorted(
        [b"line 1", b"line 2", b"line 3", b"line 4", b"new 1"]
    )
    assert sorted(t.sources().values()) == [str(live), str(live)]


def test_a_checkpoint_of_an_earlier_version_is_refused_with_what_to_do(
    spark: object, tmp_path: Path
) -> None:
    """A state written before issue 35 (line rows only, no transaction columns) cannot take a
    merge: the follower refuses it at start, in one sentence, instead of failing in the query."""
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.parquet as pq  # noqa: PLC0415 - the spark extra

    logs = tmp_path / "logs" / "broker-a"
    logs.mkdir(parents=True)
    (logs / "transaction.log").write_text("")
    ckpt = tmp_path / "ckpt"
    old = ckpt / "state" / "v00000003"
    old.mkdir(parents=True)
    (ckpt / "spark").mkdir()
    columns = ("kind", "grp", "addr", "win", "msg", "v", "file", "n", "tmin", "tmax")
    pq.write_table(
        pa.table({c: pa.array([], pa.string()) for c in columns}), old / "part-0.parquet"
    )
    (ckpt / "state.json").write_text(
        json.dumps({"batch": 3, "version": "v00000003", "flagged": {}})
    )
    cfg = follow.FollowConfig(
        job.JobConfig(inputs=[str(tmp_path / "logs")], out=str(tmp_path / "out")),
        checkpoint=str(ckpt),
    )
    with pytest.raises(follow.HealthInputError, match="delete the checkpoint directory"):
        follow.Follower(spark, cfg)  # type: ignore[arg-type]

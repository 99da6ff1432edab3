"""Live mode: ``txmsg health --follow DIR... --out OUT --trigger 30s`` on Structured Streaming.

Why a tailer in front of Spark's file source: the file source reads each file once, when it first
sees it, and never looks at it again, so the lines a broker appends to ``transaction.log`` would
be lost, and re-reading whole files would count lines twice. So a small driver-side tailer
(``Tailer``) copies every new *complete* line (up to the last ``\\n``) of the followed files into
a staging directory as a new small file, and the streaming source watches only that directory,
where files never change after they appear (written under a hidden name, then ``os.replace``).

A stream of lines is identified by its first line and its broker directory, not by its path, so
rotation is counted once: when ``transaction.log`` is renamed or compressed into
``otherdays/*.log.gz``, the rotated file starts with the same first line, and only the bytes beyond
what was already copied are staged; a new file (a fresh ``transaction.log``, a rotated file never
seen live) starts at 0. A staged file is named ``<stream>-<start>-<end>.log``: the same bytes
always get the same name, so a tailer that crashed between staging and saving its offsets
re-stages an identical file that Spark's checkpoint already knows, and on start the offsets are
also recovered from the staged names. The offsets (``offsets.json``) live beside Spark's
checkpoint.

Each trigger, ``foreachBatch`` aggregates the batch with the batch job's own per-line stages
(``patterns.pipeline``, so live and batch count alike), merges it into the state table (the same
aggregate the batch job caches, as Parquet, one version per batch id) and rewrites every output
from it with the batch job's ``_outputs``. A batch id already merged (Spark re-runs the last batch
after a crash) is not merged again. ``summary.json`` and ``dashboard.html`` are replaced with
``os.replace``; the Parquet table is a directory, which ``rename`` cannot replace, so
``metrics_by_window.parquet`` is a symlink swapped atomically to the newest version.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import zlib
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from txmsg_health import brokers, job, output
from txmsg_health import reduce as R
from txmsg_health.brokers import ROTATION_DIRS
from txmsg_health.inputs import HealthInputError, resolve

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MAX_CHUNK = 64 << 20  # bytes staged per file and poll: a huge backlog is caught up in steps
_STAGED = re.compile(r"([0-9a-f]{20})-(\d+)-(\d+)\.log$")
_TRIGGER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")


def parse_trigger(text: str) -> float:
    """``30s``, ``500ms``, ``2m``, ``1h`` or plain seconds -> seconds."""
    m = _TRIGGER.match(text)
    if not m or float(m.group(1)) <= 0:
        raise HealthInputError(
            f"--trigger {text!r}: use a positive duration such as 30s, 500ms or 2m"
        )
    scale = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]
    return float(m.group(1)) * scale


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _holder(path: str) -> str:
    parent = os.path.dirname(path)
    if os.path.basename(parent) in ROTATION_DIRS:
        parent = os.path.dirname(parent)
    return parent


class Tailer:
    """Copies new complete lines of the followed files into ``staging`` (see the module doc)."""

    def __init__(self, roots: list[str], state_dir: str) -> None:
        self.roots = roots
        self.staging = os.path.join(state_dir, "staging")
        self.offsets_path = os.path.join(state_dir, "offsets.json")
        os.makedirs(self.staging, exist_ok=True)
        self.lock = threading.Lock()
        self.streams: dict[str, dict[str, Any]] = {}  # id -> {"source": path, "consumed": bytes}
        self.gz_done: dict[str, list[int]] = {}  # rotated file -> [size, mtime_ns] already staged
        if os.path.exists(self.offsets_path):
            with open(self.offsets_path, encoding="utf-8") as f:
                saved = json.load(f)
            self.streams, self.gz_done = saved["streams"], saved["gz"]
        for name in os.listdir(self.staging):  # the staged names are the truth after a crash
            m = _STAGED.match(name)
            if m and m.group(1) in self.streams:
                s = self.streams[m.group(1)]
                s["consumed"] = max(s["consumed"], int(m.group(3)))

    def sources(self) -> dict[str, str]:
        with self.lock:
            return {k: v["source"] for k, v in self.streams.items()}

    def files(self) -> list[str]:
        found: list[str] = []
        for root in self.roots:
            if os.path.isfile(root):
                found.append(root)
                continue
            for d, dirs, names in os.walk(root):
                dirs[:] = sorted(x for x in dirs if not _hidden(x))
                found.extend(os.path.join(d, n) for n in sorted(names) if not _hidden(n))
        return found

    def poll(self) -> int:
        """Stage what is new in every followed file; returns the number of bytes staged."""
        staged = 0
        for path in self.files():
            try:
                staged += self._gz(path) if path.endswith(".gz") else self._plain(path)
            except FileNotFoundError:
                continue  # rotated away between the listing and the read: seen next poll
        if staged:
            self.save()
        return staged

    def _stream(self, path: str, first_line: bytes) -> str:
        sid = hashlib.sha256(_holder(path).encode() + b"\0" + first_line).hexdigest()[:20]
        if sid not in self.streams:
            with self.lock:
                self.streams[sid] = {"source": path, "consumed": 0}
            self.save()  # the source is known before any of its bytes are staged
        return sid

    def _plain(self, path: str) -> int:
        with open(path, "rb") as f:
            first = f.readline(1 << 16)
            if not first.endswith(b"\n"):
                return 0
            sid = self._stream(path, first)
            start = self.streams[sid]["consumed"]
            f.seek(start)
            data = f.read(MAX_CHUNK)
        end = data.rfind(b"\n") + 1  # only complete lines; the rest waits for its newline
        return self._stage(sid, start, data[:end])

    def _gz(self, path: str) -> int:
        st = os.stat(path)
        mark = [st.st_size, st.st_mtime_ns]
        if self.gz_done.get(path) == mark:
            return 0
        try:
            with gzip.open(path, "rb") as f:
                data = f.read()
        except (EOFError, OSError, zlib.error):
            return 0  # still being compressed: complete next poll
        if not data:
            return 0
        if not data.endswith(b"\n"):
            data += b"\n"  # a rotated file is complete: its last line ends here
        nl = data.find(b"\n") + 1
        sid = self._stream(path, data[:nl])
        start = self.streams[sid]["consumed"]
        n = self._stage(sid, start, data[start:])
        self.gz_done[path] = mark
        return n or 1  # save gz_done even when nothing was new

    def _stage(self, sid: str, start: int, data: bytes) -> int:
        if not data:
            return 0
        end = start + len(data)
        name = f"{sid}-{start:012d}-{end:012d}.log"
        tmp = os.path.join(self.staging, "." + name)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(self.staging, name))
        with self.lock:
            self.streams[sid]["consumed"] = end
        return len(data)

    def save(self) -> None:
        with self.lock:
            text = json.dumps({"streams": self.streams, "gz": self.gz_done}, indent=1)
        tmp = self.offsets_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, self.offsets_path)


@dataclass
class FollowConfig:
    job: job.JobConfig
    trigger_seconds: float = 30.0
    checkpoint: str | None = None  # default: <out>/_checkpoint


class Follower:
    """The running query: tailer polls, foreachBatch merges and rewrites the outputs."""

    def __init__(self, spark: SparkSession, cfg: FollowConfig) -> None:
        if cfg.job.parquet_uri:
            raise HealthInputError(
                "--parquet-uri is not supported with --follow: the live table "
                "is swapped in place under --out"
            )
        self.spark = spark
        self.cfg = cfg
        self.roots = resolve(cfg.job.inputs)
        for r in self.roots:
            if not os.path.exists(r):
                raise HealthInputError(f"{r}: --follow needs local directories or files")
        self.out = os.path.abspath(cfg.job.out)
        self.ckpt = os.path.abspath(cfg.checkpoint or os.path.join(self.out, "_checkpoint"))
        self.state_dir = os.path.join(self.ckpt, "state")
        self.meta_path = os.path.join(self.ckpt, "state.json")
        if os.path.exists(self.meta_path) and not os.path.isdir(os.path.join(self.ckpt, "spark")):
            raise HealthInputError(
                f"{self.ckpt}: the state is there but Spark's checkpoint "
                "(spark/) is not; delete the whole directory to start over"
            )
        os.makedirs(self.state_dir, exist_ok=True)
        self._check_state_columns()
        self.tailer = Tailer(self.roots, self.ckpt)
        self.stopping = False
        self.batches = 0

    def _check_state_columns(self) -> None:
        """Refuse a state written by an earlier version of the job (other columns): merging a
        batch into it would fail inside the live query with a Spark traceback."""
        version = self._meta()["version"]
        if not version:
            return
        import pyarrow.dataset as ds  # noqa: PLC0415 - the spark extra

        try:
            have = set(
                ds.dataset(os.path.join(self.state_dir, version), format="parquet").schema.names
            )
        except (OSError, ValueError):  # pyarrow.ArrowInvalid is a ValueError
            have = set()
        missing = sorted({*R.KEYS, *R.MERGES} - have)
        if missing:
            raise HealthInputError(
                f"{self.ckpt}: its state was written by an earlier txmsg health (no "
                f"{', '.join(missing[:4])}{'...' if len(missing) > 4 else ''}); delete the "
                "checkpoint directory to start over from the logs"
            )

    def _meta(self) -> dict[str, Any]:
        if not os.path.exists(self.meta_path):
            return {"batch": -1, "version": None, "flagged": {}}
        with open(self.meta_path, encoding="utf-8") as f:
            return dict(json.load(f))

    def _save_meta(self, meta: dict[str, Any]) -> None:
        tmp = self.meta_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f)
        os.replace(tmp, self.meta_path)

    def apply(self, batch: DataFrame, batch_id: int) -> None:
        """foreachBatch: merge the batch into the state (once per id), then rewrite the outputs."""
        from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

        meta = self._meta()
        if batch_id <= meta["batch"]:
            return  # merged before a restart: merging again would count its lines twice
        sources = self.tailer.sources()
        sid = F.regexp_extract(F.col("file"), _STAGED.pattern, 1)
        src = F.create_map(*[F.lit(x) for kv in sorted(sources.items()) for x in kv])[sid]
        broker = F.create_map(
            *[
                F.lit(x)
                for s, path in sorted(sources.items())
                for x in (s, brokers.name_for(path, self.roots, self.cfg.job.broker_regex))
            ]
        )[sid]
        agg = R.aggregate(batch, broker).withColumn("file", F.coalesce(src, F.col("file")))
        if meta["version"]:
            prev = self.spark.read.parquet(os.path.join(self.state_dir, meta["version"]))
            agg = prev.unionByName(agg)
        merged = R.merge(agg)
        version = f"v{batch_id:08d}"
        merged.coalesce(1).write.mode("overwrite").parquet(os.path.join(self.state_dir, version))
        old = meta["version"]
        meta.update(batch=batch_id, version=version)
        state = self.spark.read.parquet(os.path.join(self.state_dir, version))
        meta["flagged"] = self._write_outputs(state, batch_id, meta["flagged"])
        self._save_meta(meta)  # the commit point of this batch's merge
        if old:
            shutil.rmtree(os.path.join(self.state_dir, old), ignore_errors=True)
        self.batches += 1

    def _write_outputs(
        self, state: DataFrame, batch_id: int, before: dict[str, list[str]]
    ) -> dict[str, list[str]]:
        from pyspark import StorageLevel  # noqa: PLC0415 - optional: the spark extra

        os.makedirs(self.out, exist_ok=True)
        pq_name = f".metrics_by_window.{batch_id:08d}.parquet"
        cfg = replace(self.cfg.job, parquet_uri=os.path.join(self.out, pq_name))
        state = state.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            result, series = job._outputs(state, self.roots, cfg)
        except HealthInputError:
            return before  # nothing but empty lines so far
        finally:
            state.unpersist()
        result["inputs"] = list(self.cfg.job.inputs)
        result["follow"] = {
            "batch": batch_id,
            "updated": datetime.now(UTC).isoformat(),
            "trigger_seconds": self.cfg.trigger_seconds,
        }
        self._swap_parquet(pq_name)
        result["parquet"] = os.path.join(self.out, "metrics_by_window.parquet")
        output.write_summary(self.out, result)
        if cfg.dashboard:
            from txmsg_health import dashboard  # noqa: PLC0415 - jinja2 (the spark extra) only for a dashboard

            dashboard.write(self.out, result, series)
        now = {g: result["groups"][g]["reasons"] for g in result["flagged"]}
        for g, reasons in now.items():
            if g not in before:
                _log(f"group {g} crossed a threshold: {'; '.join(reasons)}")
        for g in before:
            if g not in now:
                _log(f"group {g} is back under every threshold")
        return now

    def _swap_parquet(self, pq_name: str) -> None:
        link = os.path.join(self.out, "metrics_by_window.parquet")
        if os.path.isdir(link) and not os.path.islink(link):
            shutil.rmtree(link)  # a batch run's table: replaced by the live link once
        tmp = os.path.join(self.out, ".metrics_by_window.link")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(pq_name, tmp)
        os.replace(tmp, link)
        for name in os.listdir(self.out):
            if (
                name.startswith(".metrics_by_window.")
                and name.endswith(".parquet")
                and name != pq_name
            ):
                shutil.rmtree(os.path.join(self.out, name), ignore_errors=True)

    def run(self) -> int:
        """Poll, let Spark trigger, until SIGINT/SIGTERM; returns the batches merged."""
        previous = self._install_signals()
        try:
            return self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> int:
        self.tailer.poll()
        stream = (
            self.spark.readStream.format("text").option("lineSep", "\n").load(self.tailer.staging)
        )
        from txmsg_health import patterns as P  # noqa: PLC0415 - kept next to its one use

        for stage in P.pipeline(self.cfg.job.window):
            stream = stream.select(*stage)
        query = (
            stream.writeStream.foreachBatch(self.apply)
            .option("checkpointLocation", os.path.join(self.ckpt, "spark"))
            .trigger(
                processingTime=f"{max(1, round(self.cfg.trigger_seconds * 1000))} milliseconds"
            )
            .start()
        )
        _log(f"following {', '.join(self.roots)} every {self.cfg.trigger_seconds:g}s -> {self.out}")
        next_poll = time.monotonic()
        try:
            while not self.stopping and query.isActive:
                if time.monotonic() >= next_poll:
                    self.tailer.poll()
                    next_poll = time.monotonic() + min(self.cfg.trigger_seconds, 5.0)
                time.sleep(0.1)
            exc = query.exception()
            if exc is not None:
                raise HealthInputError(f"the live query failed: {job._first_line(exc)}")
        finally:
            # let a running trigger finish, so the checkpoint and the outputs agree
            deadline = time.monotonic() + 60
            while (
                query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline
            ):
                time.sleep(0.1)
            query.stop()
            self.tailer.save()
            _log(f"stopped after {self.batches} batches; checkpoint {self.ckpt}")
        return self.batches

    def _install_signals(self) -> dict[int, Any]:
        """SIGINT/SIGTERM only set a flag: the loop then stops the query between triggers."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def stop(signum: int, _frame: object) -> None:
            self.stopping = True

        previous: dict[int, Any] = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in previous:
            signal.signal(s, stop)
        return previous


def _log(msg: str) -> None:
    print(
        f"{datetime.now(UTC).strftime('%H:%M:%S')} txmsg health: {msg}", file=sys.stderr, flush=True
    )


def follow(spark: SparkSession, cfg: FollowConfig) -> int:
    return Follower(spark, cfg).run()

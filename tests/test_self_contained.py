"""The repository is self-contained: nothing in it reads or points at ``../shared``.

Why: the repository used to be developed next to a read-only ``../shared`` directory of notes and
real-broker logs. Tests that read it skipped silently in any other checkout, and comments pointed
readers at files they do not have. The logs now live in ``tests/data/`` and the facts in
``docs/rocketmq-facts.md``; this test keeps it that way.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# "../shared", "shared/facts/...", "shared/logs/...", and a path built from a "shared" component
# (``REPO.parent / "shared" / "logs"``, ``os.path.join(root, "shared")``).
FORBIDDEN = re.compile(
    r"\.\./shared\b|\bshared/(?:facts|logs|README)|[/(,]\s*[\"']shared[\"']\s*[/,)]"
)
# Texts that may quote the old locations on purpose: this test, and change logs / issue texts.
EXEMPT = re.compile(r"^(?:CHANGELOG[^/]*|docs/issues/.*|issues/.*)$", re.IGNORECASE)
# Directories a checkout without git may still contain; never part of the repository.
UNTRACKED_DIRS = {
    ".git",
    ".venv",
    "venv",
    "var",
    "artifacts",
    "build",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "spark-warehouse",
}


def repository_files() -> list[str]:
    """Tracked files plus new, not ignored ones (``git ls-files``); a plain walk without git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        return sorted({p for p in out.decode().split("\0") if p})
    except (OSError, subprocess.CalledProcessError):
        found = []
        for root, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in UNTRACKED_DIRS and not d.endswith(".egg-info")]
            found += [(Path(root) / f).relative_to(REPO).as_posix() for f in files]
        return sorted(found)


def test_nothing_points_at_shared() -> None:
    files = repository_files()
    assert len(files) > 50, f"only {len(files)} files found under {REPO}: is this the repository?"
    hits = []
    for rel in files:
        if rel == THIS or EXEMPT.match(rel):
            continue
        path = REPO / rel
        try:
            data = path.read_bytes()
        except (
            FileNotFoundError,
            IsADirectoryError,
        ):  # deleted in the working tree, or a submodule
            continue
        if b"\0" in data[:8192]:  # binary
            continue
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:160]}")
    assert not hits, (
        "the repository must not read or point at ../shared; put test data under tests/data/ and "
        "facts into docs/ (docs/rocketmq-facts.md), then point there:\n" + "\n".join(hits)
    )


def test_the_pattern_catches_what_it_must() -> None:
    for text in [
        'REPO.parent / "shared" / "logs"',
        "see ../shared/facts/x.md",
        "``shared/facts/remoting-protocol.md``",
        "/work/shared/logs/real-broker-4.9.8/",
        "os.path.join(root, 'shared', 'logs')",
        "(see ../shared/README.md)",
    ]:
        assert FORBIDDEN.search(text), text
    for text in [
        "a shared store",
        "shared with other jobs",
        "the shared factory",
        'name="shared_pool"',
    ]:
        assert not FORBIDDEN.search(text), text

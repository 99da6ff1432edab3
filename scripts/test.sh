#!/usr/bin/env bash
# The whole test suite: lint, type check, then pytest.  Exit code 5 (no tests collected) is a failure.
# pytest runs on 5 xdist workers (addopts in pyproject.toml; grouping in conftest.py); arguments
# go to pytest: `scripts/test.sh -n 0` runs it serially, `scripts/test.sh tests/broker` a subset.
set -uo pipefail
cd "$(dirname "$0")/.."
export TXMSG_ARTIFACTS=${TXMSG_ARTIFACTS:-$PWD/artifacts}
mkdir -p "$TXMSG_ARTIFACTS"
if [ -z "${TXMSG_TEST_PG_URL:-}" ]; then
  pg_was_running=no
  [ -f "${TXMSG_PG_DIR:-$PWD/var/pg}/data/postmaster.pid" ] && pg_was_running=yes
  TXMSG_TEST_PG_URL=$(bash scripts/pg.sh) || { echo "PostgreSQL test server failed to start" >&2; exit 1; }
  export TXMSG_TEST_PG_URL
  # If we started it, we stop it: a server left running holds its port after this checkout is gone.
  [ "$pg_was_running" = no ] && trap 'bash scripts/pg.sh stop' EXIT
fi
.venv/bin/ruff check txmsg plugins spark samples benchmarks tests conftest.py || exit 1
# formatting is checked, not applied: run `.venv/bin/ruff format` before committing
.venv/bin/ruff format --check txmsg plugins spark samples benchmarks tests conftest.py || exit 1
# mypy and the docs site run beside pytest, not before it: ~1 min of a fresh clone's run on 2 cores
# (mypy's cold cache), most of it waiting, while pytest's workers wait on brokers too.  Their output
# is shown, and the run fails, once pytest is done.  The docs site (mkdocs.yml: the guide in docs/,
# the API reference from the docstrings): any warning - a broken link, a docstring griffe cannot
# parse - fails the run.
mkdir -p build
.venv/bin/mypy > build/mypy.log 2>&1 &
mypy_pid=$!
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir build/site > build/mkdocs.log 2>&1 &
mkdocs_pid=$!
# every test's seconds, for tests/durations.json (the dispatch order, conftest.py): copy the file
# there after a full run on the reference machine
export TXMSG_TEST_DURATIONS=${TXMSG_TEST_DURATIONS:-$PWD/build/test-durations.json}
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; rc=1; fi
wait "$mypy_pid"; mypy_rc=$?
cat build/mypy.log
wait "$mkdocs_pid"; mkdocs_rc=$?
cat build/mkdocs.log
if [ $mypy_rc -ne 0 ]; then echo "mypy failed (build/mypy.log)" >&2; rc=1; fi
if [ $mkdocs_rc -ne 0 ]; then echo "mkdocs build failed (build/mkdocs.log)" >&2; rc=1; fi
exit $rc

#!/usr/bin/env bash
# The whole test suite: lint, type check, then pytest.  Exit code 5 (no tests collected) is a failure.
# pytest runs on 4 xdist workers (addopts in pyproject.toml; grouping in conftest.py); arguments
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
.venv/bin/mypy || exit 1
# The docs site (mkdocs.yml: the guide in docs/, the API reference from the docstrings); any
# warning - a broken link, a docstring griffe cannot parse - fails the run.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir build/site || exit 1
# every test's seconds, for tests/durations.json (the dispatch order, conftest.py): copy the file
# there after a full run on the reference machine
export TXMSG_TEST_DURATIONS=${TXMSG_TEST_DURATIONS:-$PWD/build/test-durations.json}
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit $rc

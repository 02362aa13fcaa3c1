# ipkeep — the two commands a newcomer needs are `make test` and (later) `make demo`.
# Every target installs what it needs and is safe to re-run.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
REFERENCE_CNI_DIR ?= /usr/lib/cni

# No debug info in CI: it triples target/ and slows linking on a 2-core machine.
ifeq ($(CI),true)
export CARGO_PROFILE_DEV_DEBUG := 0
export CARGO_TERM_COLOR := never
endif

.PHONY: all build test lint deps bench fmt

all: build

## deps: install the Debian packages the tests use (reference CNI plugins, iproute2).
deps:
	@./scripts/install-deps.sh

build:
	$(CARGO) build --workspace --all-targets

## lint: formatting and clippy, warnings are errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## test: every test CI runs (needs root for the network-namespace tests).
# install-deps.sh prints KUBECTL=<path> last: the kubectl tests use that client.
test:
	@kubectl_env=$$(./scripts/install-deps.sh | tail -n 1) && export "$$kubectl_env" && \
	  echo "make test: using $$kubectl_env" && \
	  $(MAKE) --no-print-directory lint && \
	  $(CARGO) build --release -p ipkeep-plugin && \
	  $(CARGO) test --workspace

## bench: ipkeep against the reference host-local, side by side, in one run.
bench: deps
	$(CARGO) build --release -p ipkeep-plugin
	$(CARGO) run --release -p ipkeep-plugin --example bench

fmt:
	$(CARGO) fmt --all

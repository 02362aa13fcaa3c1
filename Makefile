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

# The plugin is exec'd on every node by the container runtime: it is linked statically, so it runs
# on any node whatever its C library, starts faster and maps less memory than a dynamic binary.
HOST_TRIPLE := $(shell rustc -vV | sed -n 's/^host: //p')
PLUGIN_BIN := target/$(HOST_TRIPLE)/release/ipkeep

.PHONY: all build plugin test lint deps bench bench-agent fmt crds

all: build

## deps: install the Debian packages the tests use (reference CNI plugins, iproute2).
deps:
	@./scripts/install-deps.sh

build:
	$(CARGO) build --workspace --all-targets

## plugin: the release `ipkeep` binary, statically linked, at $(PLUGIN_BIN).
plugin:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p ipkeep-plugin --target $(HOST_TRIPLE)

## lint: formatting and clippy, warnings are errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## test: every test CI runs (needs root for the network-namespace tests); the plugin's suites run
## twice, against the debug build and against the static release binary that ships.
# install-deps.sh prints KUBECTL=<path> last: the kubectl tests use that client.
test:
	@kubectl_env=$$(./scripts/install-deps.sh | tail -n 1) && export "$$kubectl_env" && \
	  echo "make test: using $$kubectl_env" && \
	  $(MAKE) --no-print-directory lint && \
	  $(MAKE) --no-print-directory plugin && \
	  $(CARGO) test --workspace 2>&1 | tee target/test.log && \
	  echo "make test: the plugin's suites again, against the static release binary $(PLUGIN_BIN)" && \
	  IPKEEP_TEST_BIN=$(CURDIR)/$(PLUGIN_BIN) $(CARGO) test -p ipkeep-plugin --tests 2>&1 | tee -a target/test.log
	@# One closing line for the whole run: cargo prints one per test binary, the last often "0 passed".
	@awk '/^test result: / { p += $$4; f += $$6; i += $$8 } \
	  END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i; if (p == 0 || f > 0) exit 1 }' target/test.log

## bench: ipkeep against the reference host-local, side by side, in one run.
bench: deps plugin
	IPKEEP_BIN=$(CURDIR)/$(PLUGIN_BIN) $(CARGO) run --release -p ipkeep-plugin --example bench

## bench-agent: the node agent with 5 000 reservations on one node: change → file latency at 100
## changes/s, full resync time, peak RSS (the released agent binary against the API test server).
bench-agent:
	$(CARGO) build --release -p ipkeep-operator --bin ipkeep-operator
	IPKEEP_OPERATOR_BIN=$(CURDIR)/target/release/ipkeep-operator $(CARGO) run --release -p ipkeep-e2e --example bench_agent

fmt:
	$(CARGO) fmt --all

## crds: regenerate crds/ from the Rust types (a test fails when the committed file drifts).
crds:
	$(CARGO) run -q -p ipkeep-operator -- crd > crds/ipreservations.ipkeep.dev.yaml

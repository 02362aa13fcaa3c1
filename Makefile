# ipkeep — the two commands a newcomer needs are `make demo` and `make test`.
# Every target installs what it needs and is safe to re-run: what a target's recipe needs is one of
# its own prerequisites (the install steps deps, packaging-deps and docker-deps included), so the
# order holds under make -j too.

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
# Where cargo puts what it builds: CARGO_TARGET_DIR when set (a cache shared between work trees),
# as scripts/build-plan.sh and scripts/build-arm64.sh read it, else the work tree's target/.
CARGO_OUT := $(abspath $(or $(CARGO_TARGET_DIR),target))
PLUGIN_BIN := $(CARGO_OUT)/$(HOST_TRIPLE)/release/ipkeep
# The image is FROM scratch: the operator is linked statically too. The daemons are built with
# the workspace's daemon profile, the plugin with its release profile (Cargo.toml says why).
OPERATOR_BIN := $(CARGO_OUT)/$(HOST_TRIPLE)/daemon/ipkeep-operator
IMAGE_ARCHIVE := target/image/ipkeep.oci.tar
# The Docker driver, static like the others: it is the managed plugin bundle's whole rootfs.
DOCKER_BIN := $(CARGO_OUT)/$(HOST_TRIPLE)/daemon/ipkeep-docker
DOCKER_PLUGIN_DIR := target/docker-plugin
# The fast tier's test targets (make check): the crates' own tests and the integration suites
# that run as any user with nothing installed. Each other suite needs root, Go-built binaries,
# Debian's reference plugins or dockerd, and fails loudly without them: make test runs them all.
FAST_TESTS := --lib --bins --test blackbox --test blackbox_private_state --test blackbox_reservation \
  --test agent_install_cni --test agent_plugin --test controller_cli --test controller_index \
  --test controller_lifecycle --test controller_placement --test controller_view \
  --test controller_webhook_tls --test controller_webhook_limits --test crd_drift --test rules_without_kube \
  --test contract --test storm
# The few tests inside those suites that need root (mknod, chattr +i): make test runs them.
FAST_SKIP := --skip every_damage_at_every_private_path_is_healed \
  --skip a_failed_index_write_is_not_forgotten_by_a_later_one --skip failed_rebuild_never_seals_a_partial_index
# Announces a step and how long it took (a cold static release build takes minutes).
STEP := scripts/step.sh

.PHONY: all build plugin check test lint deps packaging-deps docker-deps demo bench bench-controller bench-scale bench-agent \
  bench-api-cost bench-e2e fmt crds operator-static image chart-test cluster-bins node-bins flannel-bins crio-bins docker-plugin \
  bench-docker plan-demo plan-test check-fresh release release-check previous-release arm64-deps arm64 test-arm64 \
  image-arm64 sbom registry-bin etcd-tools-bins publish monitoring-picture torture torture-mutants

all: build

## deps: install the Debian packages the tests, the benches, the real nodes and the demo use (the
## reference CNI plugins, runc, iptables, busybox-static, promtool, ...: scripts/debian-packages.sh).
deps:
	@./scripts/install-deps.sh

## packaging-deps: install what the images, the release, its publishing and the chart tests use
## (buildah, readelf, skopeo, jq, kubernetes-validate in .venv).
packaging-deps:
	@./scripts/install-packaging-deps.sh

## docker-deps: install what the Docker driver's tests use (docker.io, docker-compose, busybox-static).
docker-deps:
	@./scripts/install-docker-deps.sh

## cluster-bins: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and helm,
## built from their Go modules (versions in e2e/cluster/versions.env) into a version-keyed cache
## outside the work tree; a no-op taking about a second once built. Needs Go >= 1.26 and the Go
## module proxy the first time.
cluster-bins:
	@e2e/cluster/build.sh

## node-bins: what the real test nodes run (kubelet, kube-proxy, containerd 2, its runc shim, ctr,
## the sandbox's pause program; versions in e2e/cluster/versions.env) into the same kind of cache,
## and the node images (pause, busybox workload) as OCI archives with buildah; runc and the CNI
## plugins come from Debian (make deps). See docs/real-nodes.md.
node-bins: deps packaging-deps
	@e2e/cluster/build.sh --node >/dev/null
	@$(STEP) node-bins "the node images (pause, busybox workload)" \
	  scripts/build-node-images.sh "$$(e2e/cluster/build.sh --print-node-bin-dir)" >/dev/null

## flannel-bins: flanneld and flannel's CNI plugin (versions in e2e/cluster/versions.env), the
## real nodes' network with `ipkeep-e2e cluster up --cni flannel` and the flannel suites; the same
## kind of cache. flanneld needs cgo (its UDP backend is C): the C toolchain Rust needs.
flannel-bins: deps
	@e2e/cluster/build.sh --flannel >/dev/null

## crio-bins: CRI-O and its pinns, and the upstream CNI plugins its nodes run (versions in
## e2e/cluster/versions.env), for `ipkeep-e2e cluster up --runtime cri-o` and the CRI-O suite; the
## same kind of cache. pinns is C: gcc and libc6-dev, as the static Rust builds. conmon is
## Debian's (make deps).
crio-bins: deps
	@e2e/cluster/build.sh --crio >/dev/null

## registry-bin: the OCI registry the harness runs on the host with TLS and a login (the
## distribution project's `registry`, version in e2e/cluster/versions.env), which make publish is
## tested against and the real nodes pull ipkeep from, and registry-htpasswd, which writes its
## bcrypt logins; the same kind of cache.
registry-bin:
	@e2e/cluster/build.sh --registry >/dev/null

## etcd-tools-bins: etcdctl and etcdutl at the control plane's etcd version (versions.env), which
## the etcd-restore test backs etcd up and restores it with, as an operator does; the same kind of
## cache, apart from cluster-bins' so that adding them rebuilt nothing else.
etcd-tools-bins:
	@e2e/cluster/build.sh --etcd-tools >/dev/null

build:
	$(CARGO) build --workspace --all-targets

## plugin: the release `ipkeep` binary, statically linked, at $(PLUGIN_BIN).
plugin:
	@$(STEP) plugin "ipkeep, a static release build" env RUSTFLAGS="-C target-feature=+crt-static" \
	  $(CARGO) build -q --release -p ipkeep-plugin --target $(HOST_TRIPLE)

## lint: the versions agree (make release-check), formatting, and clippy with warnings as errors.
lint: release-check
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## check: the fast tier, the first thing to run: make lint, then every test that needs neither
## root, nor the Go-built binaries, nor an install step: the pure tests of every crate, the plugin
## exec'd on scratch directories, the operator's and the Docker driver's tests. A few minutes once
## built, as any user. The slow suites (real namespaces, control plane, nodes, dockerd) are make test.
check: lint
	$(CARGO) test --workspace $(FAST_TESTS) -- $(FAST_SKIP)

## test: every test CI runs (needs root for the network-namespace tests and the real nodes); the
## plugin's suites run twice, against the debug build and against the static release binary that
## ships, then the arm64 build's under qemu-user (make test-arm64). The image archive (`make image`)
## is what the chart test installs on the real nodes.
# The real-control-plane suites and the kubectl tests use the binaries `make cluster-bins` built
# (kubectl of the same version as the API server), never the machine's own. lint comes first: it
# fails in minutes, before the long builds.
# Each failed test's name and panic again, last: a long run's log is often read from its end.
SHOW_FAILURES = awk '/^---- .* stdout ----$$/ { name = $$0; next } \
  /panicked at/ { if (!shown++) print "make test: the failures again:"; print name; c = 8 } \
  c > 0 { print "  " $$0; c-- }' target/test.log

test: plan-test lint deps packaging-deps docker-deps arm64-deps cluster-bins node-bins flannel-bins crio-bins registry-bin \
  etcd-tools-bins plugin image image-arm64 sbom docker-plugin previous-release
	@bin_dir=$$(e2e/cluster/build.sh --print-bin-dir) && \
	  node_bin_dir=$$(e2e/cluster/build.sh --print-node-bin-dir) && \
	  node_image_dir=$$(scripts/build-node-images.sh "$$node_bin_dir" | tail -n 1) && \
	  export IPKEEP_CLUSTER_BIN_DIR="$$bin_dir" && \
	  export IPKEEP_NODE_BIN_DIR="$$node_bin_dir" IPKEEP_NODE_IMAGE_DIR="$$node_image_dir" && \
	  export IPKEEP_FLANNEL_BIN_DIR="$$(e2e/cluster/build.sh --print-flannel-bin-dir)" && \
	  export IPKEEP_CRIO_BIN_DIR="$$(e2e/cluster/build.sh --print-crio-bin-dir)" && \
	  export IPKEEP_REGISTRY_BIN_DIR="$$(e2e/cluster/build.sh --print-registry-bin-dir)" && \
	  export IPKEEP_ETCD_TOOLS_BIN_DIR="$$(e2e/cluster/build.sh --print-etcd-tools-bin-dir)" && \
	  echo "make test: control plane binaries and kubectl from $$bin_dir, node binaries from $$node_bin_dir" && \
	  $(CARGO) test --workspace --no-fail-fast 2>&1 | tee target/test.log && \
	  echo "make test: the plugin's suites again, against the static release binary $(PLUGIN_BIN)" && \
	  IPKEEP_TEST_BIN=$(PLUGIN_BIN) $(CARGO) test -p ipkeep-plugin --tests 2>&1 | tee -a target/test.log && \
	  echo "make test: the arm64 build's suites under qemu-user (make test-arm64)" && \
	  $(ARM64_ENV) && ./scripts/test-arm64.sh $(ARM64_DIR) 2>&1 | tee -a target/test.log || \
	  { $(SHOW_FAILURES); exit 1; }
	@# One closing line for the whole run: cargo prints one per test binary, the last often "0 passed".
	@awk '/^test result: / { p += $$4; f += $$6; i += $$8 } \
	  END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i; if (p == 0 || f > 0) exit 1 }' target/test.log

## monitoring-picture: the real-node monitoring scenario (e2e/tests/realnode/monitoring.rs, about
## 13 minutes, root) writing what Prometheus saw of the tiny node to docs/monitoring-fill.csv, then
## drawn into docs/monitoring-fill.png, the picture in docs/operator.md's monitoring section.
monitoring-picture: deps packaging-deps cluster-bins node-bins image
	@bin_dir=$$(e2e/cluster/build.sh --print-bin-dir) && \
	  node_bin_dir=$$(e2e/cluster/build.sh --print-node-bin-dir) && \
	  export IPKEEP_CLUSTER_BIN_DIR="$$bin_dir" IPKEEP_NODE_BIN_DIR="$$node_bin_dir" && \
	  export IPKEEP_NODE_IMAGE_DIR="$$(scripts/build-node-images.sh "$$node_bin_dir" | tail -n 1)" && \
	  IPKEEP_MONITORING_CSV=$(CURDIR)/docs/monitoring-fill.csv \
	  $(CARGO) test -p ipkeep-e2e --test realnode -- monitoring:: --nocapture
	/usr/bin/python3 scripts/plot_monitoring.py docs/monitoring-fill.png docs/monitoring-fill.csv

## torture: the torture run (docs/testing.md#the-torture-run): random faults of every kind and
## churn on three real nodes (CRI-O, containerd, a tiny one) for DURATION (default 60m) from SEED
## (default: the time now, printed first; the same seed replays the same schedule), an oracle
## checking every promise every second; CNI=flannel for real flannel; WITHOUT="Kind …" leaves
## fault kinds out. Ends with its report (the
## operations and faults by kind, the times to Ready, every violation) and exits 1 on a
## violation. REPORT=file also writes the report there. Needs root; make test runs a short one.
SEED ?= $(shell date +%s)
DURATION ?= 60m
CNI ?= bridge
torture: deps packaging-deps cluster-bins node-bins crio-bins flannel-bins image
	@bin_dir=$$(e2e/cluster/build.sh --print-bin-dir) && \
	  node_bin_dir=$$(e2e/cluster/build.sh --print-node-bin-dir) && \
	  export IPKEEP_CLUSTER_BIN_DIR="$$bin_dir" IPKEEP_NODE_BIN_DIR="$$node_bin_dir" && \
	  export IPKEEP_NODE_IMAGE_DIR="$$(scripts/build-node-images.sh "$$node_bin_dir" | tail -n 1)" && \
	  export IPKEEP_CRIO_BIN_DIR="$$(e2e/cluster/build.sh --print-crio-bin-dir)" && \
	  export IPKEEP_FLANNEL_BIN_DIR="$$(e2e/cluster/build.sh --print-flannel-bin-dir)" && \
	  $(CARGO) build -q -p ipkeep-operator -p ipkeep-e2e --bins && \
	  IPKEEP_OPERATOR_BIN=$(CARGO_OUT)/debug/ipkeep-operator $(CARGO_OUT)/debug/ipkeep-e2e torture \
	    --seed $(SEED) --duration $(DURATION) --cni $(CNI) $(if $(REPORT),--report $(REPORT)) \
	    $(foreach k,$(WITHOUT),--without $(k))

## torture-mutants: each deliberately broken build of e2e/torture-mutants/ (MUTANTS=name … for
## some) through the short torture run make test passes unmutated (seed 1, or the patch's own
## `# seed: N`; 4 minutes; MUTANT_SEED, MUTANT_DURATION), which must report the
## violation of the promise the patch names (scripts/torture-mutant.sh). About 10 minutes a
## mutant; needs root.
MUTANTS ?= $(basename $(notdir $(wildcard e2e/torture-mutants/*.patch)))
MUTANT_SEED ?=
MUTANT_DURATION ?= 4m
torture-mutants: deps packaging-deps cluster-bins node-bins crio-bins image
	@bin_dir=$$(e2e/cluster/build.sh --print-bin-dir) && \
	  node_bin_dir=$$(e2e/cluster/build.sh --print-node-bin-dir) && \
	  export IPKEEP_CLUSTER_BIN_DIR="$$bin_dir" IPKEEP_NODE_BIN_DIR="$$node_bin_dir" && \
	  export IPKEEP_NODE_IMAGE_DIR="$$(scripts/build-node-images.sh "$$node_bin_dir" | tail -n 1)" && \
	  export IPKEEP_CRIO_BIN_DIR="$$(e2e/cluster/build.sh --print-crio-bin-dir)" && \
	  $(CARGO) build -q -p ipkeep-operator -p ipkeep-e2e --bins && \
	  export IPKEEP_OPERATOR_BIN=$(CARGO_OUT)/debug/ipkeep-operator IPKEEP_E2E_BIN=$(CARGO_OUT)/debug/ipkeep-e2e && \
	  for m in $(MUTANTS); do scripts/torture-mutant.sh $$m "$(MUTANT_SEED)" $(MUTANT_DURATION) || exit 1; done

## bench: ipkeep against the reference host-local, side by side, in one run.
bench: deps plugin
	IPKEEP_BIN=$(PLUGIN_BIN) $(CARGO) run --release -p ipkeep-plugin --example bench

# The benches measure the real control plane; each prints its figures with the ceiling measured
# in the same run. See docs/benchmarks.md. BENCH_ENV exports the built control plane binaries
# (make cluster-bins) and the operator the image ships (make operator-static), both prerequisites
# of each bench; the bench harnesses are built with the same daemon profile.
BENCH_ENV = export IPKEEP_CLUSTER_BIN_DIR="$$(e2e/cluster/build.sh --print-bin-dir)" \
	    IPKEEP_OPERATOR_BIN=$(OPERATOR_BIN)

## bench-controller: the controller binary against the real API server with 1 000 and 10 000
## annotated pods (ARGS="--sizes 1000,10000,30000" for more): time until every reservation is
## Bound and Released, peak RSS, lateness of 1 000 expiries due in the same second, each beside
## the API server's ceiling for the same writes.
bench-controller: deps cluster-bins operator-static
	@$(BENCH_ENV) && $(CARGO) run --profile daemon -p ipkeep-e2e --example bench_controller -- $(ARGS)

## bench-scale: the controller bench at Kubernetes' scale: 1 000, 10 000, 30 000 and 100 000
## annotated pods, each beside its ceiling, RSS per 1 000 pods from the slope, and at 100 000 a
## leader SIGKILLed beside its standby (takeover beside the Lease duration + a LIST, every write
## audited); writes docs/controller-bench.csv and draws docs/controller-bench.png from it, and
## kube-apiserver's CPU profiles of each large size's Bound step, ceiling and controller, into
## target/bench-profiles (`go tool pprof -top FILE`; hours on
## 2 busy cores; etcd and kube-apiserver hold the 100 000 pods beside it). Then 1 000 node agents'
## watches on the real kube-apiserver (its memory and CPU per agent, projected to 5 000 nodes).
## `make bench-controller` and `make bench-agent` stay short.
bench-scale: deps cluster-bins operator-static
	@$(BENCH_ENV) && $(CARGO) run --profile daemon -p ipkeep-e2e --example bench_controller -- \
	  --sizes 1000,10000,30000,100000 --failover \
	  --csv docs/controller-bench.csv --plot docs/controller-bench.png \
	  --profile $(CURDIR)/target/bench-profiles $(ARGS)
	@$(BENCH_ENV) && $(CARGO) run --profile daemon -p ipkeep-e2e --example bench_agent -- --agents 0 --fan-out 1000

## bench-agent: the node agent against the real API server: change → file latency with 5 000
## reservations at 100 changes/s beside a bare watch's, and what 50 agents add to the
## kube-apiserver's CPU and memory (projected to 5 000 nodes).
bench-agent: deps cluster-bins operator-static
	@$(BENCH_ENV) && $(CARGO) run --profile daemon -p ipkeep-e2e --example bench_agent -- $(ARGS)

## bench-api-cost: what one pod's lifecycle (create → delete → re-create → delete → expire) costs
## the real API server, per verb, for the controller and the agent, from the audit log; says
## whether "at most 4 writes per pod" and "no LIST after start-up" hold.
bench-api-cost: deps cluster-bins operator-static
	@$(BENCH_ENV) && $(CARGO) run --profile daemon -p ipkeep-e2e --example bench_api_cost -- $(ARGS)

## demo: the whole system on this machine, on real nodes: the control plane and two nodes running
## kubelet, containerd, runc and kube-proxy, ipkeep installed with `helm install` from charts/ipkeep
## and `make image`'s archive, and the story of a busybox StatefulSet pod keeping its IP, told step
## by step with kubectl. Installs and builds what it needs first (deps, packaging-deps,
## cluster-bins, node-bins, image; all cached), having said what and for how long (plan-demo).
## KEEP=1 keeps it running after the story (until Ctrl-C) and prints the KUBECONFIG. Needs root.
## Everything it starts is stopped and removed when it ends or is interrupted.
demo: plan-demo deps packaging-deps cluster-bins node-bins image
	@bin_dir=$$(e2e/cluster/build.sh --print-bin-dir) && \
	  $(STEP) demo "the demo program (ipkeep-e2e, ipkeep, ipkeep-operator; debug builds)" \
	    $(CARGO) build -q -p ipkeep-plugin -p ipkeep-operator -p ipkeep-e2e --bins && \
	  target_dir=$$($(CARGO) metadata --format-version 1 --no-deps | sed 's/.*"target_directory":"\([^"]*\)".*/\1/') && \
	  log="$$target_dir/demo.log" && echo "make demo: the components' own logs go to $$log" && \
	  IPKEEP_CLUSTER_BIN_DIR="$$bin_dir" "$$target_dir/debug/ipkeep-e2e" demo $(if $(KEEP),--keep) \
	    --image-archive $(IMAGE_ARCHIVE) 2>"$$log" || \
	  { status=$$?; [ $$status -eq 130 ] && echo "make demo: interrupted; everything it started is gone" && exit 130; \
	    echo "make demo: failed; the end of $$log:"; tail -n 25 "$$log"; exit $$status; }

## plan-demo, plan-test: what a first `make demo` or `make test` on this machine is about to install
## and build, and roughly how long each part takes (nothing once everything is cached).
plan-demo:
	@scripts/build-plan.sh demo

plan-test:
	@scripts/build-plan.sh test

fmt:
	$(CARGO) fmt --all

## crds: regenerate crds/ and the chart's copy from the Rust types (tests fail when either drifts).
crds:
	$(CARGO) run -q -p ipkeep-operator -- crd > crds/ipreservations.ipkeep.dev.yaml
	cp crds/ipreservations.ipkeep.dev.yaml charts/ipkeep/crds/ipreservations.ipkeep.dev.yaml

## operator-static: `ipkeep-operator` as the image ships it (the daemon profile), statically
## linked, at $(OPERATOR_BIN).
operator-static:
	@$(STEP) operator-static "ipkeep-operator, a static daemon-profile build" env RUSTFLAGS="-C target-feature=+crt-static" \
	  $(CARGO) build -q --locked --profile daemon -p ipkeep-operator --target $(HOST_TRIPLE)

## previous-release: the release an upgrade starts from (CHANGELOG.md's newest other than the
## workspace version), built from its own commit into its image archive and chart, in a cache
## outside the work tree keyed by its version and commit (~/.cache/ipkeep/release-<v>-<commit>);
## a no-op once built. e2e/tests/realnode/upgrade.rs upgrades from it and rolls back to it.
previous-release: packaging-deps
	@scripts/build-previous-release.sh >/dev/null

## image: the runtime image (FROM scratch, both static binaries, user 65532) built offline with
## buildah into the OCI archive $(IMAGE_ARCHIVE), named ipkeep:<version> unless IMAGE_REF names it
## (make image IMAGE_REF=localhost/ipkeep:dev IMAGE_ARCHIVE=target/image/ipkeep-local.oci.tar).
image: packaging-deps plugin operator-static
	@$(STEP) image "the image archive $(IMAGE_ARCHIVE) (buildah)" \
	  ./scripts/build-image.sh $(PLUGIN_BIN) $(OPERATOR_BIN) $(IMAGE_ARCHIVE) $(IMAGE_REF)

## chart-test: the Helm chart and image tests alone (helm and the control plane from
## `make cluster-bins`; the components the chart runs are the static operator binary).
chart-test: deps packaging-deps cluster-bins plugin operator-static
	IPKEEP_OPERATOR_BIN=$(OPERATOR_BIN) $(CARGO) test -p ipkeep-e2e --test plain -- chart_helm:: image_build::
	IPKEEP_OPERATOR_BIN=$(OPERATOR_BIN) $(CARGO) test -p ipkeep-e2e --test plane -- chart_install:: chart_rbac::

## docker-plugin: the static `ipkeep-docker` at $(DOCKER_BIN) and the managed plugin bundle
## ($(DOCKER_PLUGIN_DIR): config.json + rootfs) that `docker plugin create ipkeep $(DOCKER_PLUGIN_DIR)`
## takes. A long-running daemon like the operator: built with the same daemon profile.
# Its readelf check needs binutils, which no install step has to add: the C linker Rust uses needs it.
docker-plugin:
	@$(STEP) docker-plugin "ipkeep-docker, a static daemon-profile build" env RUSTFLAGS="-C target-feature=+crt-static" \
	  $(CARGO) build -q --locked --profile daemon -p ipkeep-docker --target $(HOST_TRIPLE)
	./scripts/build-docker-plugin.sh $(DOCKER_BIN) $(DOCKER_PLUGIN_DIR)

## bench-docker: RequestAddress latency through the driver's socket (p50/p99), and `docker run`
## on a network of the driver beside one of Docker's built-in IPAM, on a dockerd started for the
## run (needs root; installs what it needs with make docker-deps).
bench-docker: docker-deps docker-plugin
	IPKEEP_DOCKER_BIN=$(DOCKER_BIN) $(CARGO) run --profile daemon -p ipkeep-docker --example bench_docker

## bench-e2e: figures on two real nodes (docs/real-nodes.md) with the chart installed from
## `make image`'s archive: `kubectl delete pod` to the successor Ready for a retained StatefulSet
## pod beside an unannotated one (p50/p99, 20 each), the plugin's ADD as containerd logs it, and
## the controller's and agents' pod cgroup memory. Needs root; prints figures, asserts none.
bench-e2e: deps cluster-bins node-bins image
	@bin_dir=$$(e2e/cluster/build.sh --print-bin-dir) && \
	  node_bin_dir=$$(e2e/cluster/build.sh --print-node-bin-dir) && \
	  node_image_dir=$$(scripts/build-node-images.sh "$$node_bin_dir" | tail -n 1) && \
	  $(CARGO) build -q -p ipkeep-e2e --bin ipkeep-e2e --example bench_e2e && \
	  IPKEEP_CLUSTER_BIN_DIR="$$bin_dir" \
	  IPKEEP_NODE_BIN_DIR="$$node_bin_dir" IPKEEP_NODE_IMAGE_DIR="$$node_image_dir" \
	  IPKEEP_IMAGE_ARCHIVE=$(CURDIR)/$(IMAGE_ARCHIVE) $(CARGO_OUT)/debug/examples/bench_e2e

## arm64-deps: Debian's cross toolchain for aarch64 (rustc-web, cargo-web, libstd-rust-web-dev:arm64,
## gcc-aarch64-linux-gnu) and qemu-user, the arm64 architecture added to dpkg when missing.
arm64-deps:
	@./scripts/install-arm64-deps.sh

## arm64: both shipped binaries cross-built for aarch64, static, each with its profile, into
## $(ARM64_DIR) (scripts/build-arm64.sh; Debian's compiler). Its cargo target directory is a cache
## outside the work tree keyed by that compiler's version, as the Go-built binaries' are: cold, the
## aarch64 dependencies take about 10 min of a 2-core machine, and a fresh clone must not pay that
## again (cargo rebuilds whatever changed; a key no longer current is removed). The key is read
## when the recipe runs, after arm64-deps has installed the compiler.
ARM64_DIR := target/arm64
ARM64_CACHE := $(HOME)/.cache/ipkeep
ARM64_ENV := key=$$(/usr/bin/rustc -V | sha256sum | cut -c1-12) && \
  export CARGO_TARGET_DIR=$(ARM64_CACHE)/target-aarch64-$$key && mkdir -p $(ARM64_CACHE) && \
  find $(ARM64_CACHE) -maxdepth 1 -name 'target-aarch64-*' ! -name "target-aarch64-$$key" -exec rm -rf {} +
arm64: arm64-deps
	@$(ARM64_ENV) && $(STEP) arm64 "ipkeep and ipkeep-operator for aarch64 (Debian's cross toolchain)" \
	  ./scripts/build-arm64.sh $(ARM64_DIR)

## image-arm64: the image for arm64 nodes, from `make arm64`'s binaries, into $(IMAGE_ARM64_ARCHIVE)
## (same name and tag as make image's; make release puts both in one image index).
IMAGE_ARM64_ARCHIVE := target/image/ipkeep-arm64.oci.tar
image-arm64: packaging-deps arm64
	@$(STEP) image-arm64 "the arm64 image archive $(IMAGE_ARM64_ARCHIVE) (buildah)" \
	  ./scripts/build-image.sh $(ARM64_DIR)/ipkeep $(ARM64_DIR)/ipkeep-operator $(IMAGE_ARM64_ARCHIVE) $(IMAGE_REF)

## sbom: the image's SBOM: CycloneDX (JSON) of each of its binaries' Rust dependency graph, for amd64
## and for arm64, written by cargo-cyclonedx (built from its crate once into a version-keyed cache
## outside the work tree) into $(SBOM_DIR). See scripts/sbom.sh.
SBOM_DIR := target/sbom
sbom:
	@$(STEP) sbom "the image's SBOM in $(SBOM_DIR) (cargo-cyclonedx)" ./scripts/sbom.sh $(SBOM_DIR)

## test-arm64: the plugin's black-box suites against the arm64 plugin and the operator's unit tests,
## cross-compiled and run under qemu-user (scripts/test-arm64.sh says which six tests qemu cannot
## run: the neighbour table over netlink). make test runs it after the amd64 suites.
test-arm64: arm64-deps
	@$(ARM64_ENV) && ./scripts/test-arm64.sh $(ARM64_DIR)

## check-fresh: the README's first commands on a machine without what the install steps install
## (root, Debian; run it before resolving any change to an install step or a dependency): removes
## those packages (never one the system needs) and .venv, clones HEAD into a temporary directory and
## runs `make demo` then `make test` there, with each one's wall time and what each install step
## installed. ARGS="--cold-go" also empties the Go-built binaries' cache and Go's own caches;
## ARGS="--dry-run" only says what it would remove. See docs/testing.md.
check-fresh:
	@scripts/check-fresh.sh $(ARGS)

## release-check: Cargo.toml's version, Chart.yaml's version and appVersion and CHANGELOG.md's
## newest release agree (and the release's tag, when there is one, is the commit it lists).
release-check:
	@scripts/release.sh --check

## release: the artifacts of the workspace version in target/release-artifacts/: the image index
## ipkeep-<version>.oci.tar (linux/amd64 and linux/arm64), the chart package ipkeep-<version>.tgz,
## make sbom's four SBOMs ipkeep-<version>-<binary>.<arch>.cdx.json, a RELEASE note (released or UNRELEASED, the digests, each
## platform's image size) and SHA256SUMS. See docs/testing.md#releases-make-release.
release: release-check packaging-deps cluster-bins image image-arm64 sbom
	@scripts/release.sh

## publish: make release's image index (every manifest in it) pushed as $(REGISTRY)/ipkeep:<version>
## and its chart as oci://$(REGISTRY)/charts/ipkeep (scripts/publish.sh), with the user's own
## logins (buildah login, helm registry login); CA_FILE=ca.pem for a registry with a private CA.
## Says the index digest, each platform's manifest digest and image size.
# Refused before anything is built when REGISTRY is missing.
ifneq ($(filter publish,$(MAKECMDGOALS)),)
ifeq ($(REGISTRY),)
$(error make publish needs REGISTRY=host[:port], the registry to push to (see docs/testing.md#publishing-make-publish))
endif
endif
publish: release
	@scripts/publish.sh "$(REGISTRY)" $(if $(CA_FILE),--ca-file "$(CA_FILE)")

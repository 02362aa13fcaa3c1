# syntax=docker/dockerfile:1
# ipkeep's one image: the CNI plugin /ipkeep and /ipkeep-operator (controller, agent, install-cni).
# `make image` builds the same runtime stage offline with buildah (scripts/build-image.sh) from the
# binaries the workspace built; keep the two in step.

# Builder: both binaries statically linked (the runtime stage has no C library), from the locked
# dependency graph, each with its profile (Cargo.toml: the plugin's release, the daemon's).
FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
ENV RUSTFLAGS="-C target-feature=+crt-static" CARGO_TERM_COLOR=never
RUN triple="$(rustc -vV | sed -n 's/^host: //p')" \
 && cargo build --locked --release -p ipkeep-plugin --target "$triple" \
 && cargo build --locked --profile daemon -p ipkeep-operator --target "$triple" \
 && mkdir /out \
 && cp "target/$triple/release/ipkeep" "target/$triple/daemon/ipkeep-operator" /out/

# Runtime: nothing but the two binaries, run as the distroless "nonroot" user. The agent's pods
# run it as root (the chart says why); everything else as 65532.
FROM scratch
COPY --from=builder --chmod=0555 /out/ipkeep /ipkeep
COPY --from=builder --chmod=0555 /out/ipkeep-operator /ipkeep-operator
LABEL org.opencontainers.image.title=ipkeep org.opencontainers.image.licenses=Apache-2.0
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/ipkeep-operator"]

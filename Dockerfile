# syntax=docker/dockerfile:1
# slidegate container image: docker build -t slidegate .
#
# Build stage: the Cargo registry and target/ live in BuildKit cache mounts, so a rebuild after
# a source change recompiles only slidegate itself, not its dependencies. The builder is Debian
# bookworm like the runtime image, so the binary links against the same glibc. The release
# profile links with fat LTO: give the builder at least 2 GB of memory (the link peaks at 1.8 GB).
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin slidegate \
    && cp target/release/slidegate /usr/local/bin/slidegate

# Runtime: the binary, CA certificates (for rediss://) and the default rules, run as non-root.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin slidegate
COPY --from=builder /usr/local/bin/slidegate /usr/local/bin/slidegate
COPY config/ /etc/slidegate/
USER slidegate:slidegate
ENV SLIDEGATE_CONFIG=/etc/slidegate
# 8080: HTTP (/check, /json, /healthcheck, /rlconfig, /metrics); 8081: gRPC (RLS v3, health, reflection)
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/slidegate"]
CMD ["serve"]

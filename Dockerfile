# syntax=docker/dockerfile:1
# slidegate container image: docker build -t slidegate .
#
# Build stage: the profile-guided build of scripts/build-pgo, which spends a fifth to a third less
# CPU per call than `cargo build --release` (docs/benchmarks.md, In short). It builds twice
# (instrumented, then with the profile) and trains the instrumented server for about 40 s on
# 127.0.0.1 in between, under the load generator (bench/, which is why the context holds it; the
# image gets only the server), against a local redis-server so that the Redis store is optimised
# too: about 13 minutes on 2 cores, and it fetches rustup's llvm-tools. Each build links with fat
# LTO: give the builder at least 2 GB of memory (a link peaks at 1.8 GB). The Cargo registry and
# target/ live in BuildKit cache mounts, so the build needs BuildKit: Docker's default builder
# since version 23; with an older engine, `DOCKER_BUILDKIT=1 docker build -t slidegate .`. The
# builder is Debian bookworm like the runtime image, so the binary links against the same glibc.
FROM rust:1-bookworm AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    scripts/build-pgo \
    && cp target/pgo/slidegate /usr/local/bin/slidegate

# Runtime: the binary, CA certificates (for rediss://) and the default rules, run as non-root.
# `/bin/ratelimit` is envoyproxy/ratelimit's command: a Deployment of it that names the command
# keeps working with this image. The default rules are found through the working directory
# (`--config`'s default `config` -> /etc/slidegate) rather than SLIDEGATE_CONFIG: that variable
# would take precedence over envoyproxy/ratelimit's RUNTIME_ROOT (docs/from-envoyproxy-ratelimit.md, "Its environment
# variables").
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 slidegate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin slidegate \
    && mkdir -p /srv/slidegate \
    && ln -s /etc/slidegate /srv/slidegate/config \
    && ln -s /usr/local/bin/slidegate /bin/ratelimit
COPY --from=builder /usr/local/bin/slidegate /usr/local/bin/slidegate
COPY config/ /etc/slidegate/
# Numeric, so that a pod's `runAsNonRoot: true` can verify it without a `runAsUser` (the kubelet
# cannot tell whether a user name is root); deploy/kubernetes sets the same ids.
USER 10001:10001
WORKDIR /srv/slidegate
# 8080: HTTP (/check, /json, /healthcheck); 8081: gRPC (RLS v3, health, reflection);
# 6070: the operator listener (/metrics, /rlconfig), on 127.0.0.1 unless SLIDEGATE_ADMIN_ADDR says
# otherwise (e.g. 0.0.0.0:6070 where Prometheus scrapes the container)
EXPOSE 8080 8081 6070
ENTRYPOINT ["/usr/local/bin/slidegate"]
CMD ["serve"]

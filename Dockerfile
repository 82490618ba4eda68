# syntax=docker/dockerfile:1
# hotsplit container image: a Debian rust builder, then a slim runtime holding the release binary
# only, run as a non-root user.
#
#   docker build -t hotsplit .            (or: podman build --format docker -t hotsplit .)
#   docker run --rm -p 7070:7070 hotsplit serve --redis redis-cluster://10.0.0.1:6379
#
# The HEALTHCHECK needs the Docker image format: podman's default OCI format drops it (with a
# warning), hence --format docker.

# The workspace's rust-version (Cargo.toml): 1.89, for std's File::try_lock.
ARG RUST_VERSION=1.89
ARG DEBIAN_RELEASE=bookworm

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# The whole tree (less .dockerignore): the workspace members (devcluster/, redis-info/) and the
# benches and tests Cargo.toml names must exist.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin hotsplit \
    && install -D -m 0755 target/release/hotsplit /out/hotsplit

FROM docker.io/library/debian:${DEBIAN_RELEASE}-slim
# A fixed uid/gid so a mounted spool volume's ownership is predictable.
RUN groupadd --system --gid 10001 hotsplit \
    && useradd --system --uid 10001 --gid hotsplit --home-dir /var/lib/hotsplit \
        --no-create-home --shell /usr/sbin/nologin hotsplit \
    && install -d -o hotsplit -g hotsplit -m 0750 /var/lib/hotsplit
COPY --from=build /out/hotsplit /usr/local/bin/hotsplit
USER hotsplit:hotsplit
# The spool's default path, hotsplit-data/spool, is relative to the working directory, so it
# lands in the volume unless the config names another heal.spool_dir.
WORKDIR /var/lib/hotsplit
VOLUME ["/var/lib/hotsplit"]
# Listen on every interface inside the container (the default, 127.0.0.1:7070, is unreachable
# from outside it). A config file or --listen overrides this. A non-loopback address needs a
# config with [auth] tokens_file (and TLS in front: server.tls_terminated_upstream) or
# server.allow_unauthenticated = true; without either, serve exits 2 naming the field.
ENV HOTSPLIT_LISTEN=0.0.0.0:7070
EXPOSE 7070
# The image has no curl or shell: the binary probes its own readiness. If you move the listener
# off port 7070, override the health check too; with TLS on the listener (server.tls_cert_file),
# probe https://127.0.0.1:7070/readyz with --ca-file naming the CA that signed its certificate
# (which must name 127.0.0.1).
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["/usr/local/bin/hotsplit", "probe", "--timeout", "2s", "http://127.0.0.1:7070/readyz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/hotsplit"]
CMD ["serve"]

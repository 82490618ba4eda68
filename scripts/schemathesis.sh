#!/usr/bin/env bash
# Runs schemathesis (pinned below) with `--checks all` against /openapi.json of a running
# hotsplit: once on the embedded store, once on a standalone redis-server this script starts on
# a free loopback port and kills by PID. Fails when schemathesis reports any failure.
#
# Configuration: scripts/schemathesis/ (schemathesis.toml: seed, examples, expected statuses;
# hooks.py: the check that explains config-dependent refusals; hotsplit.toml: the instance,
# to which this script adds a tokens file with one all-scopes token that every request carries).
# schemathesis is installed into a venv under target/ when missing. Set HOTSPLIT_BIN to test
# another binary (default: target/debug/hotsplit, built here if needed).
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
venv=target/schemathesis-venv
if ! "$venv/bin/st" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        echo "schemathesis.sh: installing python3-venv (Debian package) ..."
        sudo_cmd=""
        if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
        $sudo_cmd apt-get update -qq
        $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    fi
    rm -rf "$venv"
    echo "schemathesis.sh: installing schemathesis==$SCHEMATHESIS_VERSION into $venv ..."
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

bin=${HOTSPLIT_BIN:-target/debug/hotsplit}
if [ -z "${HOTSPLIT_BIN:-}" ]; then
    cargo build --locked --quiet --bin hotsplit
fi

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Polls `$@` every 100 ms for up to 30 s.
wait_until() {
    local what=$1
    shift
    for _ in $(seq 300); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "schemathesis.sh: $what did not come up" >&2
    return 1
}

# The API token of both runs: the document declares each operation's scope, so schemathesis
# sends it on every request and its ignored_auth check sends requests without it (or with a
# wrong one), which must be refused 401.
token=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
printf 'plain:%s read,write,admin  # schemathesis\n' "$token" >"$work/tokens"
chmod 600 "$work/tokens"

# run NAME [REDIS_URL]: starts hotsplit on the embedded store or on REDIS_URL, runs
# schemathesis against it, stops it.
run() {
    local name=$1 redis_url=${2:-}
    local port config log
    port=$(free_port)
    config="$work/$name.toml"
    log="$work/$name.log"
    cp scripts/schemathesis/hotsplit.toml "$config"
    printf '[heal]\nspool_dir = "%s"\n[auth]\ntokens_file = "%s"\n' "$work/spool-$name" "$work/tokens" >>"$config"
    local args=(serve --listen "127.0.0.1:$port" --config "$config")
    if [ -n "$redis_url" ]; then args+=(--redis "$redis_url"); fi
    HOTSPLIT_LOG=warn "$bin" "${args[@]}" >"$log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    wait_until "hotsplit ($name)" python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
        "http://127.0.0.1:$port/readyz" || { cat "$log" >&2; return 1; }
    echo "schemathesis.sh: $name store, hotsplit on 127.0.0.1:$port"
    local status=0
    "$venv/bin/st" --config-file scripts/schemathesis/schemathesis.toml --no-color \
        run "http://127.0.0.1:$port/openapi.json" --checks all \
        --header "Authorization: Bearer $token" || status=$?
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    if [ "$status" -ne 0 ]; then
        echo "schemathesis.sh: schemathesis failed on the $name store (exit $status); hotsplit's log:" >&2
        tail -n 50 "$log" >&2
        return "$status"
    fi
}

started=$(date +%s)
run embedded

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
wait_until "redis-server" redis-cli -p "$redis_port" ping
run redis "redis://127.0.0.1:$redis_port"
kill "$redis_pid"
wait "$redis_pid" 2>/dev/null || true

echo "schemathesis.sh: both runs passed in $(($(date +%s) - started)) s"

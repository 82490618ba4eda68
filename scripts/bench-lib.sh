#!/usr/bin/env bash
# Helpers shared by the benchmark scripts (bench-side-by-side.sh, bench-failfast.sh), sourced after
# the script sets ROOT (the repository), STARTED_AT ($SECONDS at its start) and BENCH_NAME (the
# log prefix). Sourcing installs missing tools, creates $WORK and the exit trap that kills every
# process the script started (by pid) and removes $WORK unless it failed.
# shellcheck shell=bash

# knob NAME FULL QUICK: keeps NAME when the environment sets it, else the mode's default (QUICK=1:
# the quick run's).
knob() {
    local value=$2
    [ "$QUICK" != 1 ] || value=$3
    printf -v "$1" '%s' "${!1:-$value}"
}

log() { printf '[%s +%ss] %s\n' "$BENCH_NAME" "$((SECONDS - STARTED_AT))" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# --- tools ------------------------------------------------------------------------------------
ensure_tools() {
    local missing=() packages=()
    command -v redis-server >/dev/null || packages+=(redis-server)
    { command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null; } || packages+=(redis-tools)
    command -v wrk >/dev/null || packages+=(wrk)
    command -v curl >/dev/null || packages+=(curl)
    command -v jq >/dev/null || packages+=(jq)
    command -v ss >/dev/null || packages+=(iproute2)
    command -v nutcracker >/dev/null || packages+=(nutcracker)
    [ ${#packages[@]} -eq 0 ] && return 0
    log "installing missing tools: ${packages[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${packages[@]}" >&2
    for tool in redis-server redis-cli redis-benchmark wrk curl jq ss nutcracker; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] || die "still missing after apt-get: ${missing[*]}"
}
ensure_tools

# --- processes: everything started is tracked and killed by pid -------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hotsplit-bench.XXXXXX")
PIDS=()
KEEP_WORK=0

# forget_pid PID: drops PID from the pids the cleanup kills (once it has been reaped, the pid may
# be handed to someone else's process).
forget_pid() {
    local kept=() pid
    for pid in "${PIDS[@]}"; do
        [ "$pid" = "$1" ] || kept+=("$pid")
    done
    PIDS=("${kept[@]}")
}

# stop_pids PID...: SIGTERM, up to 3 s to exit, then SIGKILL; reaps and forgets each.
stop_pids() {
    local pid alive
    for pid in "$@"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for _ in $(seq 30); do
        alive=0
        for pid in "$@"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    for pid in "$@"; do
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        forget_pid "$pid"
    done
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    [ ${#PIDS[@]} -eq 0 ] || stop_pids "${PIDS[@]}"
    if [ "$status" -ne 0 ]; then
        log "failed (exit $status); logs kept in $WORK"
    elif [ "$KEEP_WORK" -eq 1 ]; then
        log "logs kept in $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# bounded SECONDS COMMAND...: runs COMMAND under `timeout` as a tracked background job and waits
# for it, so a signal to this script interrupts the wait and the cleanup kills it (timeout passes
# the signal to COMMAND's whole process group: cargo and the bench it runs).
bounded() {
    local limit=$1 pid status=0
    shift
    timeout "$limit" "$@" &
    pid=$!
    PIDS+=("$pid")
    wait "$pid" || status=$?
    forget_pid "$pid"
    return "$status"
}

# --- ports ------------------------------------------------------------------------------------
TAKEN_PORTS=" "
port_is_free() {
    [[ "$TAKEN_PORTS" != *" $1 "* ]] && [ -z "$(ss -Htan "sport = :$1" 2>/dev/null)" ]
}
# Sets FREE_PORT to a port in 20000-50000 that no TCP socket uses (listening or connected) and
# this script has not handed out; with "bus", port + 10000 too (the cluster bus). It sets a
# variable rather than printing, so the record of handed-out ports survives (no subshell).
free_port() {
    local port _
    for _ in $(seq 500); do
        port=$((20000 + RANDOM % 30001))
        if port_is_free "$port" && { [ "${1:-}" != bus ] || port_is_free $((port + 10000)); }; then
            TAKEN_PORTS+="$port $((port + 10000)) "
            FREE_PORT=$port
            return 0
        fi
    done
    die "no free port found in 20000-50000"
}

# Runs "$@" until it succeeds, every 0.1 s, for at most $1 seconds (first argument).
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

# --- small helpers ----------------------------------------------------------------------------
# ratio A B: A / B with two decimals ("–" when either is missing or B is 0).
ratio() {
    awk -v a="${1:-}" -v b="${2:-}" 'BEGIN {
        if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b + 0 == 0) print "–"; else printf "%.2f", a / b }'
}
# percent PART WHOLE: PART as a percentage of WHOLE, one decimal.
percent() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "–"; else printf "%.1f", 100 * a / b }'; }
# mib KB: KB in MiB, one decimal.
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
verdict() { awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN { if (v == "–" || v == "") { print "–"; exit } ok = (op == ">=") ? v >= t : v <= t; print ok ? "ok" : "MISSED" }'; }
cli() {
    local port=$1
    shift
    redis-cli -h 127.0.0.1 -p "$port" "$@"
}

# --- redis ------------------------------------------------------------------------------------
redis_ping() { [ "$(cli "$1" ping 2>/dev/null)" = PONG ]; }

# start_redis NAME [bus] [extra args...]: starts a redis-server (in the foreground of a background
# job) on a free port, and sets STARTED_PORT. A port can be taken between the check and the bind
# (an outgoing connection picks it as its ephemeral port), so a bind failure retries another port.
start_redis() {
    local name=$1 need_bus=""
    shift
    if [ "${1:-}" = bus ]; then
        need_bus=bus
        shift
    fi
    local attempt port dir pid
    for attempt in 1 2 3 4 5; do
        free_port $need_bus
        port=$FREE_PORT
        dir="$WORK/$name-$port"
        mkdir -p "$dir"
        local cluster_args=()
        [ -z "$need_bus" ] || cluster_args=(--cluster-enabled yes --cluster-config-file "$dir/nodes.conf")
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
            --dir "$dir" --logfile "$dir/redis.log" "${cluster_args[@]}" "$@" &
        pid=$!
        PIDS+=("$pid")
        if wait_for 10 redis_ping "$port"; then
            STARTED_PORT=$port
            STARTED_PID=$pid
            return 0
        fi
        if ! grep -q "Address already in use" "$dir/redis.log" 2>/dev/null; then
            die "redis-server on port $port did not answer PING; see $dir/redis.log"
        fi
        log "port $port was taken before redis-server bound it (attempt $attempt); trying another"
    done
    die "could not start redis-server ($name) after 5 attempts"
}

# --- hotsplit ---------------------------------------------------------------------------------
# start_hotsplit NAME REDIS_URL FAMILY_TOML [SERVER_TOML] [LOG_FILTER]: starts the release build of
# hotsplit over REDIS_URL (the embedded store when it is empty) with the given [[family]] tables,
# extra [server] lines and log filter (default info) on a free port, with a spool of its own
# (unless FAMILY_TOML has a [heal] table), waits for /readyz, and sets STARTED_PORT and STARTED_PID.
start_hotsplit() {
    local name=$1 redis_url=$2 families=$3 server=${4:-} filter=${5:-info} port
    free_port
    port=$FREE_PORT
    # A spool of its own, unless FAMILY_TOML brings a [heal] table (two instances cannot share one).
    local heal=""
    [[ "$families" == *"[heal]"* ]] || heal=$(printf '[heal]\nspool_dir = "%s"' "$WORK/$name-spool")
    printf '[server]\nlisten = "127.0.0.1:%s"\n%s\n%s\n\n%s\n' \
        "$port" "$server" "$heal" "$families" >"$WORK/$name.toml"
    local store=(--redis "$redis_url")
    [ -n "$redis_url" ] || store=()
    log "starting hotsplit ($name) on 127.0.0.1:$port over ${redis_url:-the embedded store}"
    HOTSPLIT_LOG=$filter "${CARGO_TARGET_DIR:-$ROOT/target}/release/hotsplit" serve "${store[@]}" --listen "127.0.0.1:$port" \
        --config "$WORK/$name.toml" >"$WORK/$name.log" 2>&1 &
    STARTED_PID=$!
    STARTED_PORT=$port
    PIDS+=("$STARTED_PID")
    wait_for 20 curl -fsS --max-time 2 "http://127.0.0.1:$port/readyz" ||
        die "hotsplit ($name) did not become ready; see $WORK/$name.log"
}

family() { printf '[[family]]\nprefix = "%s"\ncopies = %s\n' "$1" "$2"; }

# publish_value BASE KEY COPIES [TOKEN]: publishes the value at version 1, checks that every copy
# (each index, under any of its names) applied and that a read returns it; with TOKEN (read and write scopes), both send it.
publish_value() {
    local base=$1 key=$2 copies=$3 token=${4:-} reply applied answer auth=()
    [ -z "$token" ] || auth=(-H "Authorization: Bearer $token")
    reply=$(curl -fsS --max-time 10 "${auth[@]}" -X PUT --data-binary "@$WORK/value.bin" "$base/v1/keys/$key?version=1") ||
        die "publishing $key failed"
    # Copies applied, by index: while a new family's placement window is open, a copy is
    # written under its suffix name and its spread name, two outcomes for one copy.
    applied=$(jq -r '[.outcomes[] | select(.outcome == "applied") | .copy] | unique | length' <<<"$reply")
    [ "$applied" = "$copies" ] || die "publish of $key applied to $applied of $copies copies: $reply"
    answer=$(curl -sS --max-time 5 "${auth[@]}" -o /dev/null -w '%{http_code} %{size_download}' "$base/v1/keys/$key?client=check")
    [ "$answer" = "200 $VALUE_BYTES" ] || die "a read of $key answered \"$answer\", not \"200 $VALUE_BYTES\""
}

# The wrk script of every HTTP read run: wrk -s "$WRK_AFFINE_LUA" BASE -- PATH IDS [PAUSE_MS] reads
# PATH<client id> with IDS client ids per thread, pausing PAUSE_MS after each answer when given.
WRK_AFFINE_LUA="$ROOT/scripts/wrk-affine.lua"

# wrk_field OUT rps|requests|p50|p99|non2xx
wrk_field() {
    case "$2" in
        rps) awk '/^Requests\/sec:/ {printf "%.0f\n", $2}' "$1" ;;
        requests) awk '/ requests in / {print $1}' "$1" ;;
        p50) awk '$1 == "50%" {print $2}' "$1" ;;
        p99) awk '$1 == "99%" {print $2}' "$1" ;;
        non2xx) awk '/Non-2xx or 3xx responses:/ {print $NF}' "$1" ;;
    esac
}

# cluster_ok: whether every node of CLUSTER_PORTS reports cluster_state:ok.
cluster_ok() {
    local port
    for port in "${CLUSTER_PORTS[@]}"; do
        [[ "$(cli "$port" cluster info)" == *cluster_state:ok* ]] || return 1
    done
}

# start_cluster [NODE_TIMEOUT_MS]: starts six cluster nodes (cluster-node-timeout NODE_TIMEOUT_MS,
# default 2000) and joins them into a 3x3 cluster with redis-cli; sets CLUSTER_PORTS and CLUSTER_PIDS (in start order) and MASTER_PORTS (in slot
# order), and writes "port first-last" lines to $WORK/masters.txt and CLUSTER NODES to
# $WORK/cluster-nodes.txt.
start_cluster() {
    local port _ node_timeout=${1:-2000}
    CLUSTER_PIDS=()
    CLUSTER_PORTS=()
    for _ in 1 2 3 4 5 6; do
        start_redis cluster bus --cluster-node-timeout "$node_timeout" --repl-diskless-sync-delay 0
        CLUSTER_PORTS+=("$STARTED_PORT")
        CLUSTER_PIDS+=("$STARTED_PID")
    done
    log "started 6 cluster nodes on ports ${CLUSTER_PORTS[*]}; creating a 3x3 cluster"
    local cluster_addrs=()
    for port in "${CLUSTER_PORTS[@]}"; do cluster_addrs+=("127.0.0.1:$port"); done
    bounded 60 redis-cli --cluster create "${cluster_addrs[@]}" --cluster-replicas 1 --cluster-yes \
        >"$WORK/cluster-create.log" 2>&1 || die "redis-cli --cluster create failed; see $WORK/cluster-create.log"
    wait_for 30 cluster_ok || die "the cluster did not reach cluster_state:ok within 30 s"
    # The masters as "port first-last" lines, in slot order (from CLUSTER NODES).
    cli "${CLUSTER_PORTS[0]}" cluster nodes >"$WORK/cluster-nodes.txt"
    awk '$3 ~ /master/ && NF >= 9 { split($2, a, "[:@]"); print a[2], $9 }' "$WORK/cluster-nodes.txt" |
        sort -t' ' -k2 -n >"$WORK/masters.txt"
    MASTER_PORTS=()
    while read -r port _; do MASTER_PORTS+=("$port"); done <"$WORK/masters.txt"
    [ ${#MASTER_PORTS[@]} -eq 3 ] || die "expected 3 masters: $(cat "$WORK/cluster-nodes.txt")"
}

#!/usr/bin/env bash
# The side-by-side load run: hotsplit's HTTP affine read against plain Redis GET, publish fan-out
# against concurrent SETs, copy placement on a 3x3 cluster, and hotsplit's memory. See
# docs/PERFORMANCE.md for what each figure means and the targets.
#
# Usage: scripts/load-core.sh [--no-bench]
#   --no-bench   skip the criterion run of publish N=16 on the cluster (saves about a minute).
#
# Knobs (environment):
#   DURATION=10s      wrk duration            CONNECTIONS=64   concurrency of wrk and redis-benchmark
#   THREADS=2         wrk threads             REQUESTS=400000  redis-benchmark requests
#   VALUE_BYTES=512   size of the value       COPIES=8         copies of the "hot:" family
#   CLIENT_IDS=32     distinct client ids per wrk thread
#
# Everything runs on 127.0.0.1, on ports picked free from 20000-50000 (never 6379). Every process
# it starts is killed by pid on exit, however the script ends; every step is bounded in time.
set -euo pipefail

DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-64}
REQUESTS=${REQUESTS:-400000}
VALUE_BYTES=${VALUE_BYTES:-512}
COPIES=${COPIES:-8}
CLIENT_IDS=${CLIENT_IDS:-32}
SPREAD_COPIES=16
RUN_BENCH=1
for arg in "$@"; do
    case "$arg" in
        --no-bench) RUN_BENCH=0 ;;
        -h | --help)
            sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "load-core: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

log() { printf '[load-core] %s\n' "$*" >&2; }
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
    [ ${#packages[@]} -eq 0 ] && return 0
    log "installing missing tools: ${packages[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${packages[@]}" >&2
    for tool in redis-server redis-cli redis-benchmark wrk curl jq ss; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] || die "still missing after apt-get: ${missing[*]}"
}
ensure_tools

# --- cleanup: everything started is killed by pid ---------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hotsplit-load-core.XXXXXX")
PIDS=()
KEEP_WORK=0
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    # Give them up to 3 s to exit, then SIGKILL whatever is left.
    for _ in $(seq 30); do
        local alive=0
        for pid in "${PIDS[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
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

# --- redis ------------------------------------------------------------------------------------
redis_ping() { [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; }

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
        if kill -0 "$pid" 2>/dev/null || ! grep -q 'Address already in use' "$dir/redis.log"; then
            die "redis-server on port $port did not answer PING; see $dir/redis.log"
        fi
        log "port $port was taken before redis-server bound it (attempt $attempt); trying another"
    done
    die "could not start redis-server ($name) after 5 attempts"
}
# --- cpu accounting -----------------------------------------------------------------------------
# CPU time in clock ticks: of a running process (utime + stime), and of this shell's reaped
# children (cutime + cstime), which is how a foreground wrk or redis-benchmark is counted.
CLK_TCK=$(getconf CLK_TCK)
pid_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
child_ticks() { sed 's/^.*) //' "/proc/$$/stat" | awk '{print $14 + $15}'; }
# Busy and idle ticks of the whole machine, from the "cpu" line of /proc/stat. Busy includes
# interrupts (irq, softirq), where loopback TCP is processed: depending on the kernel's accounting
# that time is also charged to the process that was running, so only the total is comparable.
machine_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat; }
# other_seconds BUSY_TICKS OURS_TICKS: the busy time not charged to our processes, at least 0.
other_seconds() { awk -v b="$1" -v o="$2" -v hz="$CLK_TCK" 'BEGIN {d = b - o; if (d < 0) d = 0; printf "%.1f", d / hz}'; }
seconds() { awk -v t="$1" -v hz="$CLK_TCK" 'BEGIN {printf "%.1f", t / hz}'; }

CORES=$(nproc)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

start_redis standalone
STANDALONE_PORT=$STARTED_PORT
STANDALONE_PID=$STARTED_PID
log "started a standalone redis-server on 127.0.0.1:$STANDALONE_PORT"

CLUSTER_PORTS=()
for _ in 1 2 3 4 5 6; do
    start_redis cluster bus --cluster-node-timeout 2000 --repl-diskless-sync-delay 0
    CLUSTER_PORTS+=("$STARTED_PORT")
done
log "started 6 cluster nodes on ports ${CLUSTER_PORTS[*]}; creating a 3x3 cluster"
cluster_addrs=()
for port in "${CLUSTER_PORTS[@]}"; do cluster_addrs+=("127.0.0.1:$port"); done
timeout 60 redis-cli --cluster create "${cluster_addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$WORK/cluster-create.log" 2>&1 || die "redis-cli --cluster create failed; see $WORK/cluster-create.log"
cluster_ok() {
    local port
    for port in "${CLUSTER_PORTS[@]}"; do
        [[ "$(redis-cli -h 127.0.0.1 -p "$port" cluster info)" == *cluster_state:ok* ]] || return 1
    done
}
wait_for 30 cluster_ok || die "the cluster did not reach cluster_state:ok within 30 s"

# --- hotsplit ---------------------------------------------------------------------------------
log "building hotsplit (cargo build --release)"
cargo build --release --quiet --bin hotsplit || die "cargo build --release failed"
free_port
HTTP_PORT=$FREE_PORT
cat >"$WORK/hotsplit.toml" <<EOF
[server]
listen = "127.0.0.1:$HTTP_PORT"

[[family]]
prefix = "hot:"
copies = $COPIES
EOF
log "starting hotsplit on 127.0.0.1:$HTTP_PORT over redis://127.0.0.1:$STANDALONE_PORT"
"$ROOT/target/release/hotsplit" serve --redis "redis://127.0.0.1:$STANDALONE_PORT" \
    --listen "127.0.0.1:$HTTP_PORT" --config "$WORK/hotsplit.toml" >"$WORK/hotsplit.log" 2>&1 &
HOTSPLIT_PID=$!
PIDS+=("$HOTSPLIT_PID")
BASE="http://127.0.0.1:$HTTP_PORT"
wait_for 20 curl -fsS --max-time 2 "$BASE/readyz" || die "hotsplit did not become ready; see $WORK/hotsplit.log"
RSS_IDLE_KB=$(awk '/^VmRSS:/ {print $2}' "/proc/$HOTSPLIT_PID/status")

# One value of VALUE_BYTES bytes, published to every copy of hot:1.
head -c "$VALUE_BYTES" /dev/zero | tr '\0' 'v' >"$WORK/value.bin"
PUBLISH=$(curl -fsS --max-time 10 -X PUT --data-binary "@$WORK/value.bin" "$BASE/v1/keys/hot:1?version=1") ||
    die "publishing hot:1 failed"
APPLIED=$(jq -r .applied <<<"$PUBLISH")
[ "$APPLIED" = "$COPIES" ] || die "publish applied to $APPLIED of $COPIES copies: $PUBLISH"
CHECK=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code} %{size_download}' "$BASE/v1/keys/hot:1?client=check")
[ "$CHECK" = "200 $VALUE_BYTES" ] || die "a read of hot:1 answered \"$CHECK\", not \"200 $VALUE_BYTES\""

# --- redis-benchmark GET ----------------------------------------------------------------------
# Without -r, redis-benchmark's GET reads the literal key "key:__rand_int__": give it the value.
redis-cli -h 127.0.0.1 -p "$STANDALONE_PORT" -x set key:__rand_int__ <"$WORK/value.bin" >/dev/null
hits_before=$(redis-cli -h 127.0.0.1 -p "$STANDALONE_PORT" info stats | awk -F: '/^keyspace_hits:/ {print $2+0}')
log "redis-benchmark -c $CONNECTIONS -n $REQUESTS -t get (value $VALUE_BYTES bytes)"
read -r rb_busy0 rb_idle0 < <(machine_ticks)
rb_redis0=$(pid_ticks "$STANDALONE_PID") rb_client0=$(child_ticks) rb_t0=$EPOCHREALTIME
timeout 300 redis-benchmark -h 127.0.0.1 -p "$STANDALONE_PORT" -c "$CONNECTIONS" -n "$REQUESTS" -t get --csv \
    >"$WORK/redis-benchmark.csv" 2>"$WORK/redis-benchmark.err" || die "redis-benchmark failed; see $WORK"
rb_redis1=$(pid_ticks "$STANDALONE_PID") rb_client1=$(child_ticks) rb_t1=$EPOCHREALTIME
read -r rb_busy1 rb_idle1 < <(machine_ticks)
hits_after=$(redis-cli -h 127.0.0.1 -p "$STANDALONE_PORT" info stats | awk -F: '/^keyspace_hits:/ {print $2+0}')
[ $((hits_after - hits_before)) -ge "$REQUESTS" ] || die "redis-benchmark GETs missed the key"
# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
read -r REDIS_RPS REDIS_P50 REDIS_P99 < <(awk -F'"' '$2 == "GET" {print $4, $10, $14}' "$WORK/redis-benchmark.csv") || true
[ -n "${REDIS_RPS:-}" ] || die "no GET line in redis-benchmark output: $(cat "$WORK/redis-benchmark.csv")"

# --- wrk: HTTP affine reads -------------------------------------------------------------------
# Each wrk thread cycles through CLIENT_IDS client ids (about 20 bytes each), one per request, so
# the reads spread over every copy as many real clients would. wrk's request() hook cannot tell
# connections apart, so ids rotate per request rather than being pinned to a connection; the work
# per request (hash the id, pick the copy, one HMGET) is the same either way.
cat >"$WORK/affine.lua" <<'EOF'
local threads = 0
function setup(thread)
    thread:set("thread_id", threads)
    threads = threads + 1
end
function init(args)
    local path, count = args[1], tonumber(args[2])
    requests = {}
    for k = 1, count do
        local client = string.format("client-%02d-%011d", thread_id, k)
        requests[k] = wrk.format("GET", path .. client)
    end
    next_request = 0
end
function request()
    next_request = next_request % #requests + 1
    return requests[next_request]
end
EOF
log "wrk -t$THREADS -c$CONNECTIONS -d$DURATION against /v1/keys/hot:1?client=..."
wrk_hs0=$(pid_ticks "$HOTSPLIT_PID") wrk_redis0=$(pid_ticks "$STANDALONE_PID") wrk_client0=$(child_ticks)
read -r wrk_busy0 wrk_idle0 < <(machine_ticks)
wrk_t0=$EPOCHREALTIME
timeout 120 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "$WORK/affine.lua" "$BASE" \
    -- "/v1/keys/hot:1?client=" "$CLIENT_IDS" >"$WORK/wrk.txt" 2>&1 || die "wrk failed: $(cat "$WORK/wrk.txt")"
wrk_t1=$EPOCHREALTIME
read -r wrk_busy1 wrk_idle1 < <(machine_ticks)
wrk_hs1=$(pid_ticks "$HOTSPLIT_PID") wrk_redis1=$(pid_ticks "$STANDALONE_PID") wrk_client1=$(child_ticks)
HTTP_RPS=$(awk '/^Requests\/sec:/ {print $2}' "$WORK/wrk.txt")
HTTP_REQUESTS=$(awk '/ requests in / {print $1}' "$WORK/wrk.txt")
HTTP_P50=$(awk '$1 == "50%" {print $2}' "$WORK/wrk.txt")
HTTP_P99=$(awk '$1 == "99%" {print $2}' "$WORK/wrk.txt")
HTTP_BAD=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$WORK/wrk.txt")
HTTP_ERRORS=$(awk '/Socket errors:/ {sub(/^ *Socket errors: */, ""); print}' "$WORK/wrk.txt")
[ -n "$HTTP_RPS" ] || die "no Requests/sec in wrk output: $(cat "$WORK/wrk.txt")"
RSS_KB=$(awk '/^VmRSS:/ {print $2}' "/proc/$HOTSPLIT_PID/status")
HWM_KB=$(awk '/^VmHWM:/ {print $2}' "/proc/$HOTSPLIT_PID/status")
READS=$(curl -fsS --max-time 5 "$BASE/metrics" | awk '/^hotsplit_reads_total\{/ && $2 > 0 {printf "%s%s=%s", sep, $1, $2; sep=", "}')
WRK_WALL=$(awk -v a="$wrk_t0" -v b="$wrk_t1" 'BEGIN {printf "%.1f", b - a}')
WRK_CPU_HS=$(seconds $((wrk_hs1 - wrk_hs0)))
WRK_CPU_REDIS=$(seconds $((wrk_redis1 - wrk_redis0)))
WRK_CPU_CLIENT=$(seconds $((wrk_client1 - wrk_client0)))
WRK_CPU_IDLE=$(seconds $((wrk_idle1 - wrk_idle0)))
WRK_CPU_OTHER=$(other_seconds $((wrk_busy1 - wrk_busy0)) $(((wrk_hs1 - wrk_hs0) + (wrk_redis1 - wrk_redis0) + (wrk_client1 - wrk_client0))))
HS_US_PER_REQ=$(awk -v t=$((wrk_hs1 - wrk_hs0)) -v hz="$CLK_TCK" -v n="$HTTP_REQUESTS" 'BEGIN {printf "%.1f", t / hz / n * 1e6}')
RB_WALL=$(awk -v a="$rb_t0" -v b="$rb_t1" 'BEGIN {printf "%.1f", b - a}')
RB_CPU_REDIS=$(seconds $((rb_redis1 - rb_redis0)))
RB_CPU_CLIENT=$(seconds $((rb_client1 - rb_client0)))
RB_CPU_IDLE=$(seconds $((rb_idle1 - rb_idle0)))
RB_CPU_OTHER=$(other_seconds $((rb_busy1 - rb_busy0)) $(((rb_redis1 - rb_redis0) + (rb_client1 - rb_client0))))
READ_RATIO=$(awk -v a="$HTTP_RPS" -v b="$REDIS_RPS" 'BEGIN {printf "%.2f", a / b}')

# --- the ceiling: a minimal axum -> fred GET proxy under the same wrk load ----------------------
# benches/proxy_baseline.rs does one GET per request and nothing else; what hotsplit costs beyond
# it is hotsplit's own overhead (parsing, affinity, the HMGET of a hash, headers, metrics).
PROXY_BIN=$(cd "$ROOT" && cargo bench --no-run --bench proxy_baseline --message-format=json 2>/dev/null |
    jq -r 'select(.executable != null and .target.name == "proxy_baseline") | .executable' | tail -n 1)
[ -x "$PROXY_BIN" ] || die "could not build benches/proxy_baseline.rs"
free_port
PROXY_PORT=$FREE_PORT
"$PROXY_BIN" --listen "127.0.0.1:$PROXY_PORT" --redis "redis://127.0.0.1:$STANDALONE_PORT" >"$WORK/proxy.log" 2>&1 &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
wait_for 20 curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$PROXY_PORT/v1/keys/key:__rand_int__" ||
    die "the proxy baseline did not answer; see $WORK/proxy.log"
log "wrk -t$THREADS -c$CONNECTIONS -d$DURATION against the minimal proxy"
timeout 120 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "$WORK/affine.lua" "http://127.0.0.1:$PROXY_PORT" \
    -- "/v1/keys/key:__rand_int__?client=" "$CLIENT_IDS" >"$WORK/wrk-proxy.txt" 2>&1 || die "wrk failed: $(cat "$WORK/wrk-proxy.txt")"
kill "$PROXY_PID" 2>/dev/null || true
PROXY_RPS=$(awk '/^Requests\/sec:/ {print $2}' "$WORK/wrk-proxy.txt")
PROXY_P50=$(awk '$1 == "50%" {print $2}' "$WORK/wrk-proxy.txt")
PROXY_P99=$(awk '$1 == "99%" {print $2}' "$WORK/wrk-proxy.txt")
[ -n "$PROXY_RPS" ] || die "no Requests/sec in wrk output: $(cat "$WORK/wrk-proxy.txt")"
PROXY_RATIO=$(awk -v a="$PROXY_RPS" -v b="$REDIS_RPS" 'BEGIN {printf "%.2f", a / b}')
HS_VS_PROXY=$(awk -v a="$HTTP_RPS" -v b="$PROXY_RPS" 'BEGIN {printf "%.2f", a / b}')

# --- copy placement on the cluster ------------------------------------------------------------
# master address -> its slot ranges, from CLUSTER NODES.
redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" cluster nodes >"$WORK/cluster-nodes.txt"
spread_of() {
    local copies=$1 i slot
    for ((i = 0; i < copies; i++)); do
        slot=$(redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" cluster keyslot "hot:1#$i")
        awk -v slot="$slot" '$3 ~ /master/ {
            for (f = 9; f <= NF; f++) {
                n = split($f, r, "-"); lo = r[1]; hi = (n == 2) ? r[2] : r[1]
                if ($f !~ /^\[/ && slot >= lo + 0 && slot <= hi + 0) { split($2, a, "@"); print a[1] }
            }
        }' "$WORK/cluster-nodes.txt"
    done | sort | uniq -c | awk '{printf "%s%s → %s", sep, $2, $1; sep=", "}'
}
SPREAD=$(spread_of "$SPREAD_COPIES")
SPREAD_FAMILY=$(spread_of "$COPIES")

# --- publish N=16 on the cluster (criterion) --------------------------------------------------
PUB_NOTE="skipped (--no-bench); run: cargo bench --bench publish -- publish_cluster"
PUB_HS="" PUB_SET="" PUB_RATIO=""
if [ "$RUN_BENCH" -eq 1 ]; then
    log "cargo bench --bench publish -- 'publish_cluster/.*/16\$' (starts its own 3x3 cluster)"
    if timeout 900 cargo bench --quiet --bench publish -- 'publish_cluster/.*/16$' >"$WORK/bench.txt" 2>&1; then
        estimates="$ROOT/target/criterion/publish_cluster"
        median_us() { jq -r '.median.point_estimate / 1000 | . * 10 | round / 10' "$estimates/$1/16/new/estimates.json"; }
        PUB_HS=$(median_us hotsplit)
        PUB_SET=$(median_us set_join_all)
        PUB_RATIO=$(awk -v a="$PUB_HS" -v b="$PUB_SET" 'BEGIN {printf "%.2f", a / b}')
        PUB_NOTE="criterion medians, bench's own 3x3 cluster"
    else
        PUB_NOTE="cargo bench failed; output kept in $WORK/bench.txt"
        log "$PUB_NOTE"
        KEEP_WORK=1
    fi
fi

# --- report -----------------------------------------------------------------------------------
verdict() { awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN { ok = (op == ">=") ? v >= t : v <= t; print ok ? "ok" : "MISSED" }'; }
RSS_MIB=$(awk -v k="$RSS_KB" 'BEGIN {printf "%.1f", k / 1024}')
HWM_MIB=$(awk -v k="$HWM_KB" 'BEGIN {printf "%.1f", k / 1024}')
IDLE_MIB=$(awk -v k="$RSS_IDLE_KB" 'BEGIN {printf "%.1f", k / 1024}')

cat <<EOF

## hotsplit load-core — $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n)

Cores: $CORES, shared by everything (wrk, hotsplit, redis-server, redis-benchmark; no pinning).
CPU seconds used (of wall × $CORES cores available):
- during wrk (${WRK_WALL} s wall): hotsplit ${WRK_CPU_HS}, redis-server ${WRK_CPU_REDIS}, wrk ${WRK_CPU_CLIENT}, rest of the machine (other processes, uncharged interrupts) ${WRK_CPU_OTHER}, idle ${WRK_CPU_IDLE} — hotsplit used ${HS_US_PER_REQ} µs of CPU per request;
- during redis-benchmark (${RB_WALL} s wall): redis-server ${RB_CPU_REDIS}, redis-benchmark ${RB_CPU_CLIENT}, rest of the machine ${RB_CPU_OTHER}, idle ${RB_CPU_IDLE}.
Load average before the run: $LOAD_BEFORE. Value: $VALUE_BYTES bytes; hotsplit family \`hot:\`, $COPIES copies.

| Measure | hotsplit | baseline | ratio | target |
|---|---|---|---|---|
| Read throughput, $CONNECTIONS connections | ${HTTP_RPS} req/s (wrk -t$THREADS, HTTP affine read) | ${REDIS_RPS} ops/s (redis-benchmark GET) | ${READ_RATIO}× | ≥ 0.5× — $(verdict "$READ_RATIO" 0.5 ">=") |
| Read latency p50 / p99 | ${HTTP_P50} / ${HTTP_P99} | ${REDIS_P50} ms / ${REDIS_P99} ms | | |
| Minimal axum→fred GET proxy, same wrk load | ${PROXY_RPS} req/s (p50 ${PROXY_P50}, p99 ${PROXY_P99}) | ${REDIS_RPS} ops/s (redis-benchmark GET) | ${PROXY_RATIO}× (hotsplit / proxy: ${HS_VS_PROXY}×) | the ceiling for any HTTP read path here |
| Publish N=16, cluster, p50 | ${PUB_HS:-–} µs | ${PUB_SET:-–} µs (16 concurrent SETs) | ${PUB_RATIO:-–}× | ≤ 1.5× — ${PUB_RATIO:+$(verdict "$PUB_RATIO" 1.5 "<=")} |
| hotsplit RSS after the read load | ${RSS_MIB} MiB (peak ${HWM_MIB} MiB, ${IDLE_MIB} MiB idle) | | | < 64 MiB — $(verdict "$RSS_MIB" 64 "<=") |

- Copies of \`hot:1\` over the cluster's masters: $SPREAD_COPIES copies: $SPREAD; $COPIES copies: $SPREAD_FAMILY.
- Publish figures: $PUB_NOTE.
- hotsplit read outcomes: ${READS:-none}. Non-2xx answers: ${HTTP_BAD:-0}. Socket errors: ${HTTP_ERRORS:-none}.
EOF

#!/usr/bin/env bash
# The side-by-side benchmark: every hotsplit figure beside the cheapest thing it could be compared
# with, taken in one run on the same cores, and printed as ratios in a final summary table:
#   1. the library's affine read (Reader::read, benches/read.rs) against a raw fred GET of one key,
#      both as CONNECTIONS concurrent tasks;
#   2. the HTTP affine read (wrk, keep-alive) against redis-benchmark GET at the same concurrency,
#      and against a minimal HTTP->Redis GET proxy (benches/proxy_baseline.rs) under the same wrk;
#   2b. the near cache's targets (scripts/bench-near.sh): the HTTP read of a hot advisory key
#      with the near cache on against the static HTTP ceiling, and off against the minimal
#      proxy; the Redis reads one hot key causes at 10k and 50k reads/s; RSS after a flood;
#   3. each master's share of a hot key's reads on a 3x3 cluster, unsplit (1 copy) and with
#      SHARE_COPIES copies, counted by Redis itself (INFO commandstats, cmdstat_hmget);
#   4. publish to N = 1, 8, 16, 32 copies on a 3x3 cluster against N concurrent SETs and against
#      the same N FCALLs sent directly (criterion, benches/publish.rs);
#   5. the request layers' cost: the HTTP read with the request id's log span (info), the request
#      deadline and the in-flight bound on (the defaults), with bearer tokens on (a tokens file,
#      wrk sending a read token), and with both, each against the same read with everything off
#      (HOTSPLIT_LOG=warn, server.request_deadline = "0s", server.max_in_flight = 0, no tokens),
#      in rotating rounds, on a standalone Redis and on the embedded store;
#   7. the hot-key detector's cost on the near-cache hit path (scripts/bench-hot.sh): the same
#      read with [hot_keys] at its defaults and off, in rotating rounds; 7b. the detector and the
#      automatic split under a moving hotspot (benches/hot_moving/);
#   6. the Redis-protocol door (scripts/bench-resp.sh): redis-benchmark GET of a hot key through
#      hotsplit's RESP port beside Redis directly, twemproxy and the RESP ceiling
#      (benches/resp_ceiling.rs), at -P 1 and -P 16, with each server's CPU per GET; the
#      primary-class read against twemproxy; RESP publish p50 against HTTP's;
# plus hotsplit's CPU per request and its memory. See docs/PERFORMANCE.md for what each row means.
#
# Usage: scripts/bench-side-by-side.sh [--quick] [--no-publish] [--layers-only] [--near-only] [--resp-only]
#   --quick        everything briefly (about 2 minutes after a warm build) to check that the
#                  script works; its figures are too short to quote. Same as QUICK=1.
#   --no-publish   skip the criterion publish run (the longest part).
#   --layers-only  run and report only part 5 (about 4.5 minutes after a warm build).
#   --near-only    run and report only part 2b (about 3.5 minutes after a warm build).
#   --hot-only     run and report only part 7 (about 3 minutes after a warm build).
#   --resp-only    run and report only part 6 (about 3 minutes after a warm build).
#
# Knobs (environment), full-run default [quick-run default]:
#   CONNECTIONS=64       concurrency of wrk, redis-benchmark and the library read bench's tasks
#   DURATION=10s [2s]    each wrk throughput run      THREADS=2   wrk threads
#   REQUESTS=400000 [50000]  redis-benchmark GETs     VALUE_BYTES=512   the value's size
#   COPIES=8             copies of hot:1 in the throughput runs (HTTP and library)
#   CLIENT_IDS=32        distinct client ids per wrk thread in the throughput runs
#   READ_DURATION=5s [1s], READ_WARM_UP=1s [300ms], READ_ROUNDS=3 [1]: the library read bench
#   SHARE_COPIES=16      copies of the split key in the share run (beside 1 copy)
#   SHARE_DURATION=5s [2s], SHARE_CLIENT_IDS=1024 [256]: wrk per key of the share run, ids per thread
#   NEAR_ROUNDS=3 [1]    rotating rounds of part 2b's four throughput runs (medians are reported)
#   NEAR_RATES="10000 50000"  fixed read rates of the near cache's Redis-reads run, RATE_DURATION=10s [3s]
#   FLOOD_KEYS=300000 [50000], FLOOD_DURATION=30s [3s]: the near cache's flood of distinct keys
#   LAYER_ROUNDS=3 [1]   rotating wrk rounds over part 5's four sides per store (medians are reported)
#   HOT_ROUNDS=3 [1]     rotating wrk rounds of part 7 (detection on and off)
#   HOT_MOVING_DURATION=60s [16s], HOT_MOVING_ARGS="" [--split-hold 30s]: part 7b's moving hotspot
#                        (benches/hot_moving/ --duration, and further arguments of it)
#   PUBLISH_ARGS=""      extra criterion arguments of the publish run
#                        [--warm-up-time 0.5 --measurement-time 1 --sample-size 10 --nresamples 10000]
#
# Everything runs on 127.0.0.1, on ports picked free from 20000-50000 (never 6379). Every process
# it starts is killed by pid on exit, however the script ends; every step is bounded in time.
# Missing tools (redis-server, redis-tools, wrk, curl, jq, iproute2, nutcracker) are apt-get installed.
# shellcheck disable=SC2153 # the knobs below are assigned by name (knob), not misspelt.
set -euo pipefail

QUICK=${QUICK:-0}
RUN_PUBLISH=1
LAYERS_ONLY=0
NEAR_ONLY=0
HOT_ONLY=0
RESP_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        --no-publish) RUN_PUBLISH=0 ;;
        --layers-only) LAYERS_ONLY=1 ;;
        --near-only) NEAR_ONLY=1 ;;
        --hot-only) HOT_ONLY=1 ;;
        --resp-only) RESP_ONLY=1 ;;
        -h | --help)
            sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "bench-side-by-side: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
STARTED_AT=$SECONDS
BENCH_NAME=bench-side-by-side
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"
knob CONNECTIONS 64 64
knob DURATION 10s 2s
knob THREADS 2 2
knob REQUESTS 400000 50000
knob VALUE_BYTES 512 512
knob COPIES 8 8
knob CLIENT_IDS 32 32
knob READ_DURATION 5s 1s
knob READ_WARM_UP 1s 300ms
knob READ_ROUNDS 3 1
knob SHARE_COPIES 16 16
knob SHARE_DURATION 5s 2s
knob SHARE_CLIENT_IDS 1024 256
knob LAYER_ROUNDS 3 1
knob PUBLISH_ARGS "" "--warm-up-time 0.5 --measurement-time 1 --sample-size 10 --nresamples 10000"
# The copy counts benches/publish.rs measures on the cluster.
PUBLISH_COPIES=(1 8 16 32)

# --- wrk --------------------------------------------------------------------------------------
# run_wrk OUT BASE PATH IDS DURATION [WRK_OPTION...]: wrk -tTHREADS -cCONNECTIONS on BASE, requests
# PATH<client id> for IDS client ids per thread (scripts/wrk-affine.lua); WRK_OPTIONs (such as
# -H "Authorization: …") go to wrk, whose script sends them with every request.
run_wrk() {
    local out=$1 base=$2 path=$3 ids=$4 duration=$5
    shift 5
    log "wrk -t$THREADS -c$CONNECTIONS -d$duration against $base$path..."
    bounded 300 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$duration" --latency "$@" -s "$WRK_AFFINE_LUA" "$base" \
        -- "$path" "$ids" >"$out" 2>&1 || die "wrk failed: $(cat "$out")"
    grep -q '^Requests/sec:' "$out" || die "no Requests/sec in wrk output: $(cat "$out")"
}

# --- cpu accounting -----------------------------------------------------------------------------
# CPU time in clock ticks: of a running process (utime + stime), and of this shell's reaped
# children (cutime + cstime), which is how wrk or redis-benchmark is counted.
CLK_TCK=$(getconf CLK_TCK)
pid_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
child_ticks() { sed 's/^.*) //' "/proc/$$/stat" | awk '{print $14 + $15}'; }
# Busy and idle ticks of the whole machine, from the "cpu" line of /proc/stat. Busy includes
# interrupts (irq, softirq), where loopback TCP is processed: depending on the kernel's accounting
# that time is also charged to the process that was running, so only the total is comparable.
machine_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat; }
seconds() { awk -v t="$1" -v hz="$CLK_TCK" 'BEGIN {printf "%.1f", t / hz}'; }
# cpu_mark NAME SERVER_PID...: records the clock, the machine's ticks, this shell's children's
# ticks and each server's ticks under NAME.
cpu_mark() {
    local name=$1 pid busy idle
    shift
    read -r busy idle < <(machine_ticks)
    local marks=("$EPOCHREALTIME" "$(child_ticks)" "$busy" "$idle")
    for pid in "$@"; do marks+=("$pid" "$(pid_ticks "$pid")"); done
    printf '%s\n' "${marks[*]}" >"$WORK/cpu-$name"
}
# cpu_report NAME SERVER_LABEL... CLIENT_LABEL: sets CPU_REPORT to where the CPU went since
# cpu_mark NAME (one label per server pid, in order, then one for this shell's children: the
# load generator) and CPU_FIRST_TICKS to the first server's ticks.
cpu_report() {
    local name=$1 busy idle now children marks wall used i
    shift
    read -r busy idle < <(machine_ticks)
    now=$EPOCHREALTIME
    children=$(child_ticks)
    read -ra marks <"$WORK/cpu-$name"
    wall=$(awk -v a="${marks[0]}" -v b="$now" 'BEGIN {printf "%.1f", b - a}')
    local ours=$((children - marks[1])) text=""
    CPU_FIRST_TICKS=""
    for ((i = 4; i < ${#marks[@]}; i += 2)); do
        used=$(($(pid_ticks "${marks[i]}") - marks[i + 1]))
        ours=$((ours + used))
        text+="$1 $(seconds "$used"), "
        CPU_FIRST_TICKS=${CPU_FIRST_TICKS:-$used}
        shift
    done
    local other=$((busy - marks[2] - ours))
    [ "$other" -ge 0 ] || other=0
    CPU_REPORT="$wall s wall: $text$1 $(seconds $((children - marks[1]))), rest of the machine"
    CPU_REPORT+=" $(seconds "$other"), idle $(seconds $((idle - marks[3])))"
}

CORES=$(nproc)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
[ "$QUICK" != 1 ] || log "quick mode: every step is short; the figures only show that the script works"

# --- build ------------------------------------------------------------------------------------
log "building hotsplit and the benches (release)"
cargo build --release --quiet --bin hotsplit || die "cargo build --release failed"
# Part 5 alone (--layers-only) needs none of the benches.
if [ "$LAYERS_ONLY" != 1 ]; then
    cargo bench --no-run --bench proxy_baseline --bench resp_ceiling --bench read --bench publish --bench hot_moving --bench http_hit --message-format=json \
        >"$WORK/bench-build.json" 2>"$WORK/build.log" || die "cargo bench --no-run failed; see $WORK/build.log"
    bench_bin() { jq -r --arg name "$1" 'select(.executable != null and .target.name == $name) | .executable' "$WORK/bench-build.json" | tail -n 1; }
    PROXY_BIN=$(bench_bin proxy_baseline)
    RESP_CEILING_BIN=$(bench_bin resp_ceiling)
    [ -x "$PROXY_BIN" ] || die "could not build benches/proxy_baseline.rs; see $WORK/build.log"
    [ -x "$RESP_CEILING_BIN" ] || die "could not build benches/resp_ceiling.rs; see $WORK/build.log"
fi
head -c "$VALUE_BYTES" /dev/zero | tr '\0' 'v' >"$WORK/value.bin"

# --- 6 alone (--resp-only) ------------------------------------------------------------------------
# shellcheck source=scripts/bench-resp.sh
source "$ROOT/scripts/bench-resp.sh"
if [ "$RESP_ONLY" = 1 ]; then
    command -v nutcracker >/dev/null || die "part 6 compares with twemproxy: apt-get install nutcracker"
    resp_part
    printf '\n## hotsplit side by side — %s, %s, part 6 only%s\n\nCores: %s, shared by everything (no pinning). Load average before the run: %s, after: %s. Took %s s.\n\n| Target | hotsplit | baseline | ratio | goal |\n|---|---|---|---|---|\n%s\n%s\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)" "$([ "$QUICK" != 1 ] || echo ', QUICK (figures too short to quote)')" \
        "$CORES" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$((SECONDS - STARTED_AT))" "$RESP_SUMMARY" "$RESP_SECTION"
    exit 0
fi

# --- 7 alone (--hot-only) -------------------------------------------------------------------------
# shellcheck source=scripts/bench-hot.sh
source "$ROOT/scripts/bench-hot.sh"
if [ "$HOT_ONLY" = 1 ]; then
    hot_part
    printf '\n## hotsplit side by side — %s, %s, part 7 only%s\n\nCores: %s, shared by everything (no pinning). Load average before the run: %s, after: %s. Took %s s.\n\n| Target | hotsplit | baseline | ratio | goal |\n|---|---|---|---|---|\n%s\n%s\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)" "$([ "$QUICK" != 1 ] || echo ', QUICK (figures too short to quote)')" \
        "$CORES" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$((SECONDS - STARTED_AT))" "$HOT_SUMMARY" "$HOT_SECTION"
    exit 0
fi

# --- 2b alone (--near-only) ----------------------------------------------------------------------
# shellcheck source=scripts/bench-near.sh
source "$ROOT/scripts/bench-near.sh"
if [ "$NEAR_ONLY" = 1 ]; then
    near_cache_part
    printf '\n## hotsplit side by side — %s, %s, part 2b only%s\n\nCores: %s, shared by everything (no pinning). Load average before the run: %s, after: %s. Took %s s.\n\n| Target | hotsplit | baseline | ratio | goal |\n|---|---|---|---|---|\n%s\n%s\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)" "$([ "$QUICK" != 1 ] || echo ', QUICK (figures too short to quote)')" \
        "$CORES" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$((SECONDS - STARTED_AT))" "$NEAR_SUMMARY" "$NEAR_SECTION"
    exit 0
fi

# --- 5. the request layers' cost on the HTTP read path (run first: --layers-only stops after it) ---
# Four instances over the same store, differing only in the request layers:
#   off     no request log span (HOTSPLIT_LOG=warn), no request deadline, no in-flight bound, no
#           tokens;
#   layers  the request id's log span (the default info filter), the request deadline and the
#           in-flight bound (the defaults), no tokens;
#   tokens  [auth] tokens_file (three sha256: entries) and wrk sending the read-scope token, the
#           other layers off;
#   all     the layers and the tokens.
# wrk visits them in turn (the order rotates every round), and each one's median is compared with
# off's. Only the instance under wrk is busy. Every instance still chooses and echoes a request id.
LAYERS_OFF=$'request_deadline = "0s"\nmax_in_flight = 0'
LAYER_SIDES=(off layers tokens all)
# The tokens file holds sha256: lines only (no secret), as the README advises: a publisher
# (read,write), a Prometheus (admin) and the reader whose token wrk presents.
random_token() { head -c 24 /dev/urandom | base64 | tr -d '=+/'; }
token_line() { printf 'sha256:%s %s  # %s\n' "$(printf %s "$1" | sha256sum | cut -d' ' -f1)" "$2" "$3"; }
READ_TOKEN=$(random_token)
WRITE_TOKEN=$(random_token)
{
    token_line "$WRITE_TOKEN" read,write publisher
    token_line "$(random_token)" admin prometheus
    token_line "$READ_TOKEN" read reader
} >"$WORK/tokens"
AUTH_TOML=$(printf '[auth]\ntokens_file = "%s"' "$WORK/tokens")
median() { sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}'; }
declare -A LAYERS_RPS=() LAYERS_ALL=()
# layer_rounds NAME REDIS_URL: sets LAYERS_RPS[NAME/SIDE] to the median req/s of each side and
# LAYERS_ALL[NAME] to every round's figures.
layer_rounds() {
    local name=$1 redis_url=$2 side round i server filter families token
    local -A pid=() base=()
    for side in "${LAYER_SIDES[@]}"; do
        server="" filter=info families=$(family hot: "$COPIES") token=""
        case $side in off | tokens) server=$LAYERS_OFF filter=warn ;; esac
        case $side in tokens | all) families+=$'\n'"$AUTH_TOML" token=$WRITE_TOKEN ;; esac
        start_hotsplit "layers-$side-$name" "$redis_url" "$families" "$server" "$filter"
        pid[$side]=$STARTED_PID base[$side]="http://127.0.0.1:$STARTED_PORT"
        # The embedded store is per process: each instance needs the value of its own.
        if [ -z "$redis_url" ] || [ "$side" = off ]; then
            publish_value "${base[$side]}" hot:1 "$COPIES" "$token"
        fi
        : >"$WORK/layers-$name-$side"
    done
    for ((round = 0; round < LAYER_ROUNDS; round++)); do
        for ((i = 0; i < ${#LAYER_SIDES[@]}; i++)); do
            side=${LAYER_SIDES[(round + i) % ${#LAYER_SIDES[@]}]}
            local auth=()
            case $side in tokens | all) auth=(-H "Authorization: Bearer $READ_TOKEN") ;; esac
            run_wrk "$WORK/wrk-layers.txt" "${base[$side]}" "/v1/keys/hot:1?client=" "$CLIENT_IDS" "$DURATION" "${auth[@]}"
            [ -z "$(wrk_field "$WORK/wrk-layers.txt" non2xx)" ] ||
                die "part 5 ($name, $side): non-2xx answers: $(cat "$WORK/wrk-layers.txt")"
            wrk_field "$WORK/wrk-layers.txt" rps >>"$WORK/layers-$name-$side"
        done
    done
    stop_pids "${pid[@]}"
    LAYERS_ALL[$name]=""
    for side in "${LAYER_SIDES[@]}"; do
        LAYERS_RPS[$name/$side]=$(median <"$WORK/layers-$name-$side")
        LAYERS_ALL[$name]+="${LAYERS_ALL[$name]:+; }$side $(paste -sd/ "$WORK/layers-$name-$side")"
    done
}
# cost ON OFF: how much lower ON is than OFF, in percent of OFF.
cost() { awk -v on="$1" -v off="$2" 'BEGIN { if (off + 0 == 0) print "–"; else printf "%.1f", 100 * (off - on) / off }'; }
# layer_cell NAME SIDE: SIDE's req/s, its ratio to off and its cost.
layer_cell() {
    local on=${LAYERS_RPS[$1/$2]} off=${LAYERS_RPS[$1/off]}
    printf '%s req/s, %s× (%s %%)' "$on" "$(ratio "$on" "$off")" "$(cost "$on" "$off")"
}
log "part 5: request layers and tokens, $LAYER_ROUNDS rotating round(s) of $DURATION per side and store"
start_redis layers
LAYERS_REDIS_PID=$STARTED_PID
layer_rounds redis "redis://127.0.0.1:$STARTED_PORT"
stop_pids "$LAYERS_REDIS_PID"
layer_rounds embedded ""
L_REDIS_ON=${LAYERS_RPS[redis/all]} L_REDIS_OFF=${LAYERS_RPS[redis/off]}
L_REDIS_COST=$(cost "$L_REDIS_ON" "$L_REDIS_OFF")
LAYERS_REPORT="### 5. The request layers' and tokens' cost on the HTTP read ($CONNECTIONS connections; wrk -t$THREADS -d$DURATION, medians of $LAYER_ROUNDS rotating rounds)

Off: \`HOTSPLIT_LOG=warn\`, \`request_deadline = \"0s\"\`, \`max_in_flight = 0\`, no tokens. Layers: the request
id's \`request\` log span at the default \`info\` filter, \`server.request_deadline\` = 5s and
\`server.max_in_flight\` = 1024 (the defaults). Tokens: \`[auth] tokens_file\` with three \`sha256:\` entries,
wrk sending the \`read\` token as \`Authorization: Bearer\`, the layers off. All: layers and tokens. Every
instance chooses and echoes a request id. Each cell: req/s, the ratio to off, and the cost in % of off.

| Store | all off | layers | tokens | all on, tokens included | target (all on) |
|---|---|---|---|---|---|
| standalone Redis (\`hot:1\`, $COPIES copies) | ${LAYERS_RPS[redis/off]} req/s | $(layer_cell redis layers) | $(layer_cell redis tokens) | $(layer_cell redis all) | < 5 % — $(verdict "$L_REDIS_COST" 5 "<=") |
| embedded store | ${LAYERS_RPS[embedded/off]} req/s | $(layer_cell embedded layers) | $(layer_cell embedded tokens) | $(layer_cell embedded all) | – |

- Every round (req/s): Redis ${LAYERS_ALL[redis]}; embedded ${LAYERS_ALL[embedded]}."
if [ "$LAYERS_ONLY" = 1 ]; then
    printf '\n## hotsplit side by side — %s, %s, part 5 only%s\n\nCores: %s, shared by everything (no pinning). Load average before the run: %s. Took %s s.\n\n%s\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)" "$([ "$QUICK" != 1 ] || echo ', QUICK (figures too short to quote)')" \
        "$CORES" "$LOAD_BEFORE" "$((SECONDS - STARTED_AT))" "$LAYERS_REPORT"
    exit 0
fi

# --- 1. library read against raw fred GET -------------------------------------------------------
log "library read bench: $CONNECTIONS tasks, $READ_ROUNDS round(s) of $READ_DURATION per side"
bounded 900 cargo bench --quiet --bench read -- --duration "$READ_DURATION" --warm-up "$READ_WARM_UP" \
    --rounds "$READ_ROUNDS" --concurrency "$CONNECTIONS" --copies "$COPIES" --value-bytes "$VALUE_BYTES" \
    >"$WORK/read.txt" 2>"$WORK/read.err" || die "benches/read.rs failed: $(tail -n 5 "$WORK/read.err")"
read_figure() { awk -v name="read/$1:" '$1 == name {print $2}' "$WORK/read.txt"; }
LIB_GET=$(read_figure fred_get)
LIB_HMGET=$(read_figure fred_hmget)
LIB_HS=$(read_figure hotsplit)
LIB_VS_GET=$(read_figure ratio/hotsplit_vs_fred_get)
LIB_VS_HMGET=$(read_figure ratio/hotsplit_vs_fred_hmget)
{ [ -n "$LIB_HS" ] && [ -n "$LIB_VS_GET" ]; } || die "unexpected output of benches/read.rs: $(cat "$WORK/read.txt")"

# --- 2. HTTP affine read against redis-benchmark GET and a minimal proxy ----------------------
start_redis standalone
STANDALONE_PORT=$STARTED_PORT
STANDALONE_PID=$STARTED_PID
start_hotsplit hotsplit "redis://127.0.0.1:$STANDALONE_PORT" "$(family hot: "$COPIES")"
HOTSPLIT_PID=$STARTED_PID
BASE="http://127.0.0.1:$STARTED_PORT"
RSS_IDLE_KB=$(awk '/^VmRSS:/ {print $2}' "/proc/$HOTSPLIT_PID/status")
publish_value "$BASE" hot:1 "$COPIES"

# Without -r, redis-benchmark's GET reads the literal key "key:__rand_int__": give it the value.
cli "$STANDALONE_PORT" -x set key:__rand_int__ <"$WORK/value.bin" >/dev/null
keyspace_hits() { cli "$STANDALONE_PORT" info stats | awk -F: '/^keyspace_hits:/ {print $2+0}'; }
hits_before=$(keyspace_hits)
log "redis-benchmark -c $CONNECTIONS -n $REQUESTS -t get (value $VALUE_BYTES bytes)"
cpu_mark redis-benchmark "$STANDALONE_PID"
bounded 300 redis-benchmark -h 127.0.0.1 -p "$STANDALONE_PORT" -c "$CONNECTIONS" -n "$REQUESTS" -t get --csv \
    >"$WORK/redis-benchmark.csv" 2>"$WORK/redis-benchmark.err" || die "redis-benchmark failed; see $WORK"
cpu_report redis-benchmark redis-server redis-benchmark
CPU_RB=$CPU_REPORT
[ $(($(keyspace_hits) - hits_before)) -ge "$REQUESTS" ] || die "redis-benchmark GETs missed the key"
# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
read -r REDIS_RPS REDIS_P50 REDIS_P99 < <(awk -F'"' '$2 == "GET" {printf "%.0f %s %s\n", $4, $10, $14}' "$WORK/redis-benchmark.csv") || true
[ -n "${REDIS_RPS:-}" ] || die "no GET line in redis-benchmark output: $(cat "$WORK/redis-benchmark.csv")"

cpu_mark wrk "$HOTSPLIT_PID" "$STANDALONE_PID"
run_wrk "$WORK/wrk.txt" "$BASE" "/v1/keys/hot:1?client=" "$CLIENT_IDS" "$DURATION"
cpu_report wrk hotsplit redis-server wrk
CPU_WRK=$CPU_REPORT
HTTP_RPS=$(wrk_field "$WORK/wrk.txt" rps)
HTTP_P50=$(wrk_field "$WORK/wrk.txt" p50)
HTTP_P99=$(wrk_field "$WORK/wrk.txt" p99)
HTTP_BAD=$(wrk_field "$WORK/wrk.txt" non2xx)
HS_US_PER_REQ=$(awk -v t="$CPU_FIRST_TICKS" -v hz="$CLK_TCK" -v n="$(wrk_field "$WORK/wrk.txt" requests)" \
    'BEGIN {printf "%.1f", t / hz / n * 1e6}')
RSS_KB=$(awk '/^VmRSS:/ {print $2}' "/proc/$HOTSPLIT_PID/status")
HWM_KB=$(awk '/^VmHWM:/ {print $2}' "/proc/$HOTSPLIT_PID/status")
# read_outcomes BASE: hotsplit's non-zero read counters (every read should be "affine").
read_outcomes() { curl -fsS --max-time 5 "$1/metrics" | awk '/^hotsplit_reads_total\{/ && $2 > 0 {printf "%s%s=%s", sep, $1, $2; sep=", "}'; }
READS=$(read_outcomes "$BASE")
stop_pids "$HOTSPLIT_PID"

# benches/proxy_baseline.rs does one GET per request and nothing else; what hotsplit costs beyond
# it is hotsplit's own overhead (parsing, affinity, the HMGET of a hash, headers, metrics).
free_port
PROXY_BASE="http://127.0.0.1:$FREE_PORT"
"$PROXY_BIN" --listen "127.0.0.1:$FREE_PORT" --redis "redis://127.0.0.1:$STANDALONE_PORT" >"$WORK/proxy.log" 2>&1 &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
wait_for 20 curl -fsS --max-time 2 -o /dev/null "$PROXY_BASE/v1/keys/key:__rand_int__" ||
    die "the proxy baseline did not answer; see $WORK/proxy.log"
run_wrk "$WORK/wrk-proxy.txt" "$PROXY_BASE" "/v1/keys/key:__rand_int__?client=" "$CLIENT_IDS" "$DURATION"
stop_pids "$PROXY_PID" "$STANDALONE_PID"
PROXY_RPS=$(wrk_field "$WORK/wrk-proxy.txt" rps)
PROXY_P50=$(wrk_field "$WORK/wrk-proxy.txt" p50)
PROXY_P99=$(wrk_field "$WORK/wrk-proxy.txt" p99)

# --- 2b. the near cache's targets (scripts/bench-near.sh) ---------------------------------------
near_cache_part

# --- 7. the hot-key detector's cost (scripts/bench-hot.sh) ---------------------------------------
hot_part

# --- 6. the Redis-protocol door (scripts/bench-resp.sh) ------------------------------------------
RESP_SECTION="" RESP_SUMMARY=""
if command -v nutcracker >/dev/null; then
    resp_part
else
    log "part 6 skipped: nutcracker (twemproxy) is not installed (apt-get install nutcracker)"
fi

# --- 3. each master's share of a hot key's reads on a 3x3 cluster -----------------------------
start_cluster

seeds=$(printf '127.0.0.1:%s,' "${MASTER_PORTS[@]}")
start_hotsplit hotsplit-cluster "redis-cluster://${seeds%,}" \
    "$(family one: 1)
$(family hot: "$SHARE_COPIES")"
CLUSTER_HS_PID=$STARTED_PID
CLUSTER_BASE="http://127.0.0.1:$STARTED_PORT"
publish_value "$CLUSTER_BASE" one:1 1
publish_value "$CLUSTER_BASE" hot:1 "$SHARE_COPIES"

# master_of_slot SLOT: the port of the master that serves SLOT.
master_of_slot() {
    awk -v slot="$1" '$3 ~ /master/ {
        for (f = 9; f <= NF; f++) {
            n = split($f, r, "-"); lo = r[1]; hi = (n == 2) ? r[2] : r[1]
            if ($f !~ /^\[/ && slot >= lo + 0 && slot <= hi + 0) { split($2, a, "[:@]"); print a[2] }
        }
    }' "$WORK/cluster-nodes.txt"
}
# measure_share NAME KEY COPIES: how many of the copies KEY#0..COPIES-1 each master holds, and
# how many HMGETs it served while wrk read KEY through hotsplit with many client ids (its
# INFO commandstats, reset before). Writes "port copies hmget_calls" lines to $WORK/share-NAME.
measure_share() {
    local name=$1 key=$2 copies=$3 i port slot
    for ((i = 0; i < copies; i++)); do
        slot=$(cli "${MASTER_PORTS[0]}" cluster keyslot "$key#$i")
        master_of_slot "$slot"
    done >"$WORK/placement-$name"
    for port in "${MASTER_PORTS[@]}"; do cli "$port" config resetstat >/dev/null; done
    run_wrk "$WORK/wrk-share-$name.txt" "$CLUSTER_BASE" "/v1/keys/$key?client=" "$SHARE_CLIENT_IDS" "$SHARE_DURATION"
    for port in "${MASTER_PORTS[@]}"; do
        printf '%s %s %s\n' "$port" "$(grep -cx "$port" "$WORK/placement-$name" || true)" \
            "$(cli "$port" info commandstats | awk -F'[:=,]' '$1 == "cmdstat_hmget" {print $3 + 0}')"
    done >"$WORK/share-$name"
}
# share_stats NAME: "hottest-share-% hmget-total http-requests" of a measure_share run.
share_stats() {
    awk -v requests="$(wrk_field "$WORK/wrk-share-$1.txt" requests)" \
        '{ calls[NR] = $3 + 0; total += $3 } END { for (i in calls) if (calls[i] > max) max = calls[i]
           printf "%.1f %d %d\n", total ? 100 * max / total : 0, total, requests }' "$WORK/share-$1"
}
measure_share unsplit one:1 1
measure_share split hot:1 "$SHARE_COPIES"
read -r SHARE1_MAX SHARE1_CALLS SHARE1_REQUESTS < <(share_stats unsplit)
read -r SHARE16_MAX SHARE16_CALLS SHARE16_REQUESTS < <(share_stats split)
SHARE_READS=$(read_outcomes "$CLUSTER_BASE")
stop_pids "$CLUSTER_HS_PID"
EVEN_SHARE=$(awk -v n=${#MASTER_PORTS[@]} 'BEGIN {printf "%.1f", 100 / n}')

# --- 4. publish fan-out against N SETs and N direct FCALLs (criterion) ------------------------
PUB_NOTE="skipped (--no-publish); run: cargo bench --bench publish -- publish_cluster"
if [ "$RUN_PUBLISH" -eq 1 ]; then
    read -ra publish_args <<<"$PUBLISH_ARGS"
    log "cargo bench --bench publish -- publish_cluster/ ${publish_args[*]} (starts its own 3x3 cluster)"
    touch "$WORK/publish.start"
    if bounded 1800 cargo bench --quiet --bench publish -- 'publish_cluster/' "${publish_args[@]}" >"$WORK/publish.txt" 2>&1; then
        PUB_NOTE="criterion medians, the bench's own 3x3 cluster${PUBLISH_ARGS:+ ($PUBLISH_ARGS)}"
    else
        PUB_NOTE="cargo bench failed; output kept in $WORK/publish.txt"
        log "$PUB_NOTE"
        KEEP_WORK=1
    fi
fi
# median_us BENCH N: criterion's median of publish_cluster/BENCH/N in µs, if this run wrote it.
median_us() {
    local file="$TARGET_DIR/criterion/publish_cluster/$1/$2/new/estimates.json"
    [ "$RUN_PUBLISH" -eq 1 ] && [ "$file" -nt "$WORK/publish.start" ] || return 0
    jq -r '.median.point_estimate / 1000 | . * 10 | round / 10' "$file"
}

# --- report -----------------------------------------------------------------------------------
RSS_MIB=$(mib "$RSS_KB")
READ_RATIO=$(ratio "$HTTP_RPS" "$REDIS_RPS")
PUBLISH_ROWS="" PUBLISH_SUMMARY=""
for n in "${PUBLISH_COPIES[@]}"; do
    hs=$(median_us hotsplit "$n") fcall=$(median_us fcall_join_all "$n") set=$(median_us set_join_all "$n")
    PUBLISH_ROWS+="| $n | ${hs:-–} µs | ${set:-–} µs | $(ratio "$hs" "$set")× | ${fcall:-–} µs | $(ratio "$hs" "$fcall")× |
"
    target="–"
    [ "$n" != 16 ] || target="≤ 1.5× — $(verdict "$(ratio "$hs" "$set")" 1.5 "<=")"
    PUBLISH_SUMMARY+="| Publish, N = $n (cluster, p50), vs $n SET(s) sent at once | ${hs:-–} µs | ${set:-–} µs | $(ratio "$hs" "$set")× | $target |
| Publish, N = $n, vs the same $n FCALL(s) sent at once | ${hs:-–} µs | ${fcall:-–} µs | $(ratio "$hs" "$fcall")× | what hotsplit adds |
"
done
SHARE_ROWS=""
while read -r port slots; do
    read -r _ copies1 calls1 <<<"$(grep "^$port " "$WORK/share-unsplit")"
    read -r _ copies16 calls16 <<<"$(grep "^$port " "$WORK/share-split")"
    SHARE_ROWS+="| 127.0.0.1:$port (slots $slots) | $copies1 | $(percent "$calls1" "$SHARE1_CALLS") % | $copies16 | $(percent "$calls16" "$SHARE16_CALLS") % |
"
done <"$WORK/masters.txt"
MODE="full run"
[ "$QUICK" != 1 ] || MODE="QUICK run (figures too short to quote)"

cat <<EOF

## hotsplit side by side — $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $MODE

Cores: $CORES, shared by everything (no pinning). Load average before the run: $LOAD_BEFORE.
Value: $VALUE_BYTES bytes. Concurrency: $CONNECTIONS everywhere. Took $((SECONDS - STARTED_AT)) s.

### 1. Library read ($CONNECTIONS tasks on one tokio runtime, $READ_ROUNDS interleaved round(s) of $READ_DURATION per side; benches/read.rs)

| Side | reads/s |
|---|---|
| \`Reader::read\`, affine, key with $COPIES copies (hotsplit) | $LIB_HS |
| raw fred \`GET\` of one key | $LIB_GET |
| raw fred \`HMGET\` of one copy (the command hotsplit sends) | $LIB_HMGET |

### 2. HTTP read ($CONNECTIONS connections; wrk -t$THREADS -d$DURATION, keep-alive)

| Side | throughput | p50 / p99 |
|---|---|---|
| hotsplit affine read (\`hot:1\`, $COPIES copies, $((CLIENT_IDS * THREADS)) client ids) | $HTTP_RPS req/s | $HTTP_P50 / $HTTP_P99 |
| minimal axum→fred GET proxy | $PROXY_RPS req/s | $PROXY_P50 / $PROXY_P99 |
| redis-benchmark GET (-n $REQUESTS) | $REDIS_RPS ops/s | ${REDIS_P50} ms / ${REDIS_P99} ms |

- CPU during wrk on hotsplit (CPU seconds of wall × $CORES): $CPU_WRK; hotsplit used $HS_US_PER_REQ µs of CPU per request.
- CPU during redis-benchmark: $CPU_RB.
- hotsplit RSS after the read load: $RSS_MIB MiB (peak $(mib "$HWM_KB"), idle $(mib "$RSS_IDLE_KB")).
- hotsplit read outcomes: ${READS:-none}. Non-2xx answers: ${HTTP_BAD:-0}.

${NEAR_SECTION}
${RESP_SECTION}
${HOT_SECTION}
### 3. Each master's share of a hot key's reads (3x3 cluster, INFO commandstats cmdstat_hmget)

| Master | copies of \`one:1\` | its share of \`one:1\` reads | copies of \`hot:1\` | its share of \`hot:1\` reads |
|---|---|---|---|---|
${SHARE_ROWS}
- \`one:1\` (1 copy): $SHARE1_CALLS HMGETs for $SHARE1_REQUESTS HTTP reads; \`hot:1\` ($SHARE_COPIES copies): $SHARE16_CALLS HMGETs for $SHARE16_REQUESTS HTTP reads (wrk -d$SHARE_DURATION, $((SHARE_CLIENT_IDS * THREADS)) client ids).
- hotsplit read outcomes on the cluster: ${SHARE_READS:-none}.

### 4. Publish fan-out on a 3x3 cluster — $PUB_NOTE

| N | hotsplit publish | N concurrent SETs | ratio | N direct FCALL hotsplit_cas_v2 | ratio |
|---|---|---|---|---|---|
${PUBLISH_ROWS}
### Summary: ratios taken in this one run

| Comparison | hotsplit | baseline | ratio | target |
|---|---|---|---|---|
| Library affine read vs raw fred GET, $CONNECTIONS tasks | $LIB_HS reads/s | $LIB_GET reads/s | ${LIB_VS_GET}× | – |
| Library affine read vs raw fred HMGET of one copy | $LIB_HS reads/s | $LIB_HMGET reads/s | ${LIB_VS_HMGET}× | what the library adds |
| HTTP affine read vs redis-benchmark GET, $CONNECTIONS connections | $HTTP_RPS req/s | $REDIS_RPS ops/s | ${READ_RATIO}× | ≥ 0.5× — $(verdict "$READ_RATIO" 0.5 ">=") |
| HTTP affine read vs minimal HTTP→Redis GET proxy | $HTTP_RPS req/s | $PROXY_RPS req/s | $(ratio "$HTTP_RPS" "$PROXY_RPS")× | – |
| Minimal proxy vs redis-benchmark GET (the HTTP ceiling) | $PROXY_RPS req/s | $REDIS_RPS ops/s | $(ratio "$PROXY_RPS" "$REDIS_RPS")× | – |
${NEAR_SUMMARY}${HOT_SUMMARY}${RESP_SUMMARY}${PUBLISH_SUMMARY}| Hottest master's share of reads, 1 copy, vs an even share | $SHARE1_MAX % | $EVEN_SHARE % | $(ratio "$SHARE1_MAX" "$EVEN_SHARE")× | – |
| Hottest master's share of reads, $SHARE_COPIES copies, vs an even share | $SHARE16_MAX % | $EVEN_SHARE % | $(ratio "$SHARE16_MAX" "$EVEN_SHARE")× | – |
| hotsplit RSS after the read load | $RSS_MIB MiB | 64 MiB | $(ratio "$RSS_MIB" 64)× | < 1× — $(verdict "$RSS_MIB" 64 "<=") |
| HTTP read with every request layer on, tokens included, vs all off (Redis; cost in % of the off figure) | $L_REDIS_ON req/s | $L_REDIS_OFF req/s | $(ratio "$L_REDIS_ON" "$L_REDIS_OFF")× ($L_REDIS_COST % cost) | < 5 % — $(verdict "$L_REDIS_COST" 5 "<=") |

$LAYERS_REPORT
EOF

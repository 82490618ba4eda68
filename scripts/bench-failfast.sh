#!/usr/bin/env bash
# The fail-fast benchmark (issue 10, "Fail fast around a sick node"): hotsplit on a 3x3 cluster
# under a read-heavy load with publishes, before and while one master is stopped (SIGSTOP).
#   1. unfaulted: wrk for DURATION, WRITE_PERCENT % publishes and the rest affine reads over KEYS
#      keys of COPIES copies each;
#   2. SIGSTOP one master, then the first second of load (the onset, reported apart), then wrk for
#      DURATION again: its throughput against the unfaulted run's (target ≥ 0.5×) and its p99
#      (target ≤ 50 ms);
#   3. SIGCONT, wait for the retry queue to drain and the node to take reads back, then check that
#      every copy of every key holds the same version (read on its owner with redis-cli).
# The cluster's node timeout (60 s) is longer than the fault, so no failover happens: this measures
# hotsplit around a stopped node, not Redis Cluster's failover.
#
# Usage: scripts/bench-failfast.sh [--quick]
#   --quick   everything briefly (about a minute after a warm build), to check that the script
#             works; its figures are too short to quote. Same as QUICK=1.
#
# Knobs (environment), full-run default [quick-run default]:
#   CONNECTIONS=64   THREADS=2   DURATION=10s [3s]   each measured wrk run
#   KEYS=64 [16]     COPIES=8    WRITE_PERCENT=10    VALUE: the version's decimal text
#
# Everything runs on 127.0.0.1, on ports picked free from 20000-50000 (never 6379). Every process
# it starts is killed by pid on exit, however the script ends; every step is bounded in time.
# shellcheck disable=SC2153 # the knobs below are assigned by name (knob), not misspelt.
set -euo pipefail

QUICK=${QUICK:-0}
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        -h | --help)
            sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "bench-failfast: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STARTED_AT=$SECONDS
BENCH_NAME=bench-failfast
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"
knob CONNECTIONS 64 64
knob THREADS 2 2
knob DURATION 10s 3s
knob KEYS 64 16
knob COPIES 8 8
knob WRITE_PERCENT 10 10

CORES=$(nproc)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
[ "$QUICK" != 1 ] || log "quick mode: every step is short; the figures only show that the script works"

log "building hotsplit (release)"
cargo build --release --quiet --bin hotsplit || die "cargo build --release failed"

# --- the cluster and the service ----------------------------------------------------------------
start_cluster 60000
seeds=$(printf '127.0.0.1:%s,' "${MASTER_PORTS[@]}")
# start_hotsplit gives the instance a spool of its own under $WORK.
start_hotsplit failfast "redis-cluster://${seeds%,}" "$(family ff: "$COPIES")"
HS_PID=$STARTED_PID
BASE="http://127.0.0.1:$STARTED_PORT"
log "publishing version 1 of ff:0..ff:$((KEYS - 1))"
for ((k = 0; k < KEYS; k++)); do
    status=$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' -X PUT --data-binary 1 "$BASE/v1/keys/ff:$k?version=1")
    [ "$status" = 200 ] || die "publishing ff:$k answered $status"
done

# --- the load -------------------------------------------------------------------------------------
# Each request is a publish with probability WRITE_PERCENT %, else an affine read with one of 256
# client ids per thread. A thread publishes only the keys k with k mod THREADS = its id, with
# versions base + n × THREADS + id (base: microseconds since the epoch when the run starts), so a
# key's versions only grow; two publishes of one key in flight on two connections can still
# arrive in the other order, and the older one is then a 409. Statuses are counted per thread.
cat >"$WORK/failfast.lua" <<'EOF'
local threads = {}
local next_id = 0
function setup(thread)
    thread:set("id", next_id)
    next_id = next_id + 1
    table.insert(threads, thread)
end
function init(args)
    keys, write_percent, base, nthreads = tonumber(args[1]), tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
    math.randomseed(id * 7919 + 17)
    seq, n = 0, 0
    statuses = {}
end
function request()
    n = n + 1
    local k = math.random(keys) - 1
    if math.random(100) <= write_percent then
        k = k - (k % nthreads) + id
        if k >= keys then k = id end
        seq = seq + 1
        local version = string.format("%.0f", base + seq * nthreads + id)
        return wrk.format("PUT", "/v1/keys/ff:" .. k .. "?version=" .. version, nil, version)
    end
    return wrk.format("GET", "/v1/keys/ff:" .. k .. "?client=c" .. id .. "-" .. (n % 256))
end
function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
end
function done(summary, latency, requests)
    local total = {}
    for _, thread in ipairs(threads) do
        for status, count in pairs(thread:get("statuses")) do
            total[status] = (total[status] or 0) + count
        end
    end
    local line = "statuses:"
    for status, count in pairs(total) do line = line .. " " .. status .. "=" .. count end
    print(line)
end
EOF
# load NAME DURATION: runs the load for DURATION into $WORK/wrk-NAME.txt.
load() {
    local out="$WORK/wrk-$1.txt" base
    base=$(($(date +%s%N) / 1000))
    log "wrk -t$THREADS -c$CONNECTIONS -d$2 ($1)"
    bounded 300 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$2" --latency -s "$WORK/failfast.lua" "$BASE" \
        -- "$KEYS" "$WRITE_PERCENT" "$base" "$THREADS" >"$out" 2>&1 || die "wrk failed: $(cat "$out")"
    grep -q '^Requests/sec:' "$out" || die "no Requests/sec in wrk output: $(cat "$out")"
}
# p_ms NAME PERCENTILE: wrk's latency percentile (50%, 99%) of run NAME in milliseconds.
p_ms() {
    awk -v p="$2" '$1 == p {
        v = $2; unit = v; sub(/^[0-9.]+/, "", unit); sub(/[a-z]+$/, "", v)
        f = (unit == "us") ? 0.001 : (unit == "s") ? 1000 : (unit == "m") ? 60000 : 1
        printf "%.2f\n", v * f }' "$WORK/wrk-$1.txt"
}
statuses() { awk '/^statuses:/ { $1 = ""; sub(/^ /, ""); print }' "$WORK/wrk-$1.txt"; }
# scrape NAME: saves hotsplit's /metrics as $WORK/metrics-NAME.txt.
scrape() { curl -fsS --max-time 5 "$BASE/metrics" >"$WORK/metrics-$1.txt" || die "cannot read /metrics"; }
# counter_delta FROM TO METRIC: how much METRIC (summed over its labels) grew between two scrapes.
counter_delta() {
    awk -v m="$3" 'FNR == 1 { f++ } $1 ~ "^" m "({|$)" { s[f] += $NF } END { printf "%.0f\n", s[2] - s[1] }' \
        "$WORK/metrics-$1.txt" "$WORK/metrics-$2.txt"
}
# method_latency FROM TO METHOD: from hotsplit's request-latency histogram (every route and status
# of METHOD), between two scrapes: "requests, the bucket holding the p99 (≤ X ms), share over
# 50 ms". The buckets double (…, 25.6, 51.2, 102.4 ms …), so the p99 is an upper bound.
method_latency() {
    awk -v method="$3" '
        FNR == 1 { f++ }
        $1 ~ /^hotsplit_http_request_duration_seconds_bucket/ && index($1, "method=\"" method "\"") {
            le = $1; sub(/.*le="/, "", le); sub(/".*/, "", le)
            if (le == "+Inf") { all[f] += $NF; next }
            if (!((le + 0) in seen)) { seen[le + 0] = 1; order[++k] = le + 0 }
            n[f, le + 0] += $NF
        }
        END {
            count = all[2] - all[1]
            if (count <= 0) { print "0 requests"; exit }
            for (i = 2; i <= k; i++) {
                v = order[i]
                for (j = i - 1; j >= 1 && order[j] > v; j--) order[j + 1] = order[j]
                order[j + 1] = v
            }
            p99 = sprintf("> %g ms", order[k] * 1000); over = 0
            for (i = 1; i <= k; i++) {
                below = n[2, order[i]] - n[1, order[i]]
                if (p99 ~ /^>/ && below >= 0.99 * count) p99 = sprintf("≤ %g ms", order[i] * 1000)
                if (order[i] <= 0.0512) over = count - below
            }
            printf "%d requests, p99 %s, %.2f %% over 51.2 ms\n", count, p99, 100 * over / count
        }' "$WORK/metrics-$1.txt" "$WORK/metrics-$2.txt"
}

scrape before
load unfaulted "$DURATION"
scrape unfaulted

# --- the fault ------------------------------------------------------------------------------------
VICTIM=${MASTER_PORTS[0]}
for i in "${!CLUSTER_PORTS[@]}"; do
    [ "${CLUSTER_PORTS[$i]}" != "$VICTIM" ] || VICTIM_PID=${CLUSTER_PIDS[$i]}
done
VICTIM_COPIES=0
for ((k = 0; k < KEYS; k++)); do
    for ((i = 0; i < COPIES; i++)); do
        slot=$(cli "$VICTIM" cluster keyslot "ff:$k#$i")
        awk -v slot="$slot" -v port="$VICTIM" '$1 == port { split($2, r, "-"); if (slot >= r[1] + 0 && slot <= r[2] + 0) found = 1 }
            END { exit !found }' "$WORK/masters.txt" && VICTIM_COPIES=$((VICTIM_COPIES + 1))
    done
done
log "SIGSTOP of master 127.0.0.1:$VICTIM (pid $VICTIM_PID), which owns $VICTIM_COPIES of $((KEYS * COPIES)) copies"
kill -STOP "$VICTIM_PID"
load onset 1s
scrape onset
load faulted "$DURATION"
scrape faulted
AVOIDED=$(curl -fsS --max-time 5 "$BASE/readyz" | jq -c '.nodes_avoided // []' || echo "?")
DEPTH_PEAK=$(curl -fsS --max-time 5 "$BASE/v1/retry-queue?limit=0" | jq -r .depth || echo "?")
kill -CONT "$VICTIM_PID"
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# --- convergence ----------------------------------------------------------------------------------
drained() {
    [ "$(curl -fsS --max-time 2 "$BASE/v1/retry-queue?limit=0" | jq -r .depth)" = 0 ] &&
        [ "$(curl -fsS --max-time 2 "$BASE/readyz" | jq -c '.nodes_avoided // []')" = "[]" ]
}
log "SIGCONT; waiting for the retry queue to drain and the node to take reads back"
wait_for 60 drained || die "the retry queue did not drain within 60 s: $(curl -sS "$BASE/v1/retry-queue?limit=5")"
DIVERGED=0
for ((k = 0; k < KEYS; k++)); do
    versions=""
    for ((i = 0; i < COPIES; i++)); do
        versions+="$(redis-cli -c -h 127.0.0.1 -p "$VICTIM" hget "ff:$k#$i" ver) "
    done
    if [ "$(tr ' ' '\n' <<<"$versions" | sed '/^$/d' | sort -u | wc -l)" != 1 ]; then
        log "ff:$k has copies at different versions: $versions"
        DIVERGED=$((DIVERGED + 1))
    fi
done
DROPS=$(curl -fsS --max-time 5 "$BASE/metrics" | awk '/^hotsplit_retry_drops_total/ {s += $2} END {print s + 0}')
stop_pids "$HS_PID"

# --- report ---------------------------------------------------------------------------------------
RPS0=$(wrk_field "$WORK/wrk-unfaulted.txt" rps)
RPS1=$(wrk_field "$WORK/wrk-faulted.txt" rps)
P99_0=$(p_ms unfaulted 99%)
P99_1=$(p_ms faulted 99%)
SHARE=$(ratio "$RPS1" "$RPS0")
MODE="full run"
[ "$QUICK" != 1 ] || MODE="QUICK run (figures too short to quote)"
cat <<EOF

## hotsplit fail-fast — $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $MODE

Cores: $CORES, shared by everything (no pinning). Load average before: $LOAD_BEFORE; after the fault: $LOAD_AFTER.
3x3 cluster (node timeout 60 s: no failover), $KEYS keys × $COPIES copies, $WRITE_PERCENT % publishes,
wrk -t$THREADS -c$CONNECTIONS. Stopped: master 127.0.0.1:$VICTIM ($VICTIM_COPIES of $((KEYS * COPIES)) copies).

| Run | req/s | p50 | p99 | statuses |
|---|---|---|---|---|
| unfaulted, $DURATION | $RPS0 | $(p_ms unfaulted 50%) ms | $P99_0 ms | $(statuses unfaulted) |
| first second after SIGSTOP (not judged) | $(wrk_field "$WORK/wrk-onset.txt" rps) | $(p_ms onset 50%) ms | $(p_ms onset 99%) ms | $(statuses onset) |
| one master stopped, after the first second, $DURATION | $RPS1 | $(p_ms faulted 50%) ms | $P99_1 ms | $(statuses faulted) |

| Target | figure | verdict |
|---|---|---|
| throughput while stopped ≥ 0.5 × unfaulted | ${SHARE}× | $(verdict "$SHARE" 0.5 ">=") |
| p99 while stopped ≤ 50 ms | $P99_1 ms | $(verdict "$P99_1" 50 "<=") |
| every copy converged after SIGCONT | $DIVERGED of $KEYS keys diverged; $DROPS copies dropped | $([ "$DIVERGED" = 0 ] && [ "$DROPS" = 0 ] && echo ok || echo MISSED) |

- At the end of the fault: /readyz nodes_avoided $AVOIDED, retry queue depth $DEPTH_PEAK.
- hotsplit's own latency histogram, unfaulted run: GET $(method_latency before unfaulted GET); PUT $(method_latency before unfaulted PUT).
- The same while stopped (after the first second): GET $(method_latency onset faulted GET); PUT $(method_latency onset faulted PUT).
- Spool while stopped: $(counter_delta onset faulted hotsplit_spool_syncs_total) group commits (one fdatasync each) for the publishes answered 202 above, each of which waited for one.
EOF

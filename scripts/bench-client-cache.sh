#!/usr/bin/env bash
# The client-side caching benchmark: one release `hotsplit serve` (embedded store, its Redis door
# on) and one hot key of a class with a 1 s near-cache age (so a 1 s lease), read through clients
# nobody here wrote, with the scripts the tests use (tests/integration/resp_clients/pycache.py and
# nodecache.js, RESP3):
#   1. reads/s of one redis-py process (CacheConfig) with caching on vs off, and the same for
#      node-redis (BasicClientSideCache; each read yields to the event loop first, as a real reader
#      does, so the invalidations are read): ratio on/off, target ≥ 50×;
#   2. PROCESSES processes of each client reading the key at full speed with caching on at once:
#      the door's GETs per second (hotsplit_resp_commands_total{command="get"} over the run, less
#      each reader's first read);
#      expected about one per lease per connection (PROCESSES / 1 s).
# One run each: the ratios are what it reports, not absolute figures.
#
# Usage: scripts/bench-client-cache.sh [--quick]
#   --quick   everything briefly (DURATION=1), to check that the script works. Same as QUICK=1.
# It builds the release binary itself (cargo build --release --bin hotsplit); BUILD=0 runs the
# target/release/hotsplit already there.
#
# Knobs (environment), full-run default [quick-run default]:
#   DURATION=10 [1]   seconds of each measured run     PROCESSES=4   readers in step 2
#   HOTSPLIT_REDIS_PY            a python with redis-py 8.1 (default target/resp-py-venv/bin/python)
#   HOTSPLIT_IOREDIS_NODE_PATH   a node_modules with `redis` 5 (default target/resp-node/node_modules)
#   scripts/test.sh installs both there.
#
# Everything runs on 127.0.0.1, on ports picked free from 20000-50000 (never 6379). Every process
# it starts is killed by pid on exit, however the script ends.
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
            echo "bench-client-cache: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STARTED_AT=$SECONDS
BENCH_NAME=bench-client-cache
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"
knob DURATION 10 1
knob PROCESSES 4 4

PYTHON=${HOTSPLIT_REDIS_PY:-$ROOT/target/resp-py-venv/bin/python}
NODE_PATH=${HOTSPLIT_IOREDIS_NODE_PATH:-$ROOT/target/resp-node/node_modules}
export NODE_PATH
CLIENTS="$ROOT/tests/integration/resp_clients"
"$PYTHON" -c 'import redis.cache' 2>/dev/null || die "no redis-py with CacheConfig at $PYTHON (scripts/test.sh installs it)"
[ -f "$NODE_PATH/redis/package.json" ] || die "no node-redis in $NODE_PATH (scripts/test.sh installs it)"

if [ "${BUILD:-1}" != 0 ]; then
    log "building hotsplit (release)"
    cargo build --release --quiet --bin hotsplit || die "cargo build --release failed"
fi
[ -x "$ROOT/target/release/hotsplit" ] || die "no target/release/hotsplit (run without BUILD=0)"

free_port
resp_port=$FREE_PORT
start_hotsplit hotsplit-csc "" "[classes.cached]
route = \"replica\"
reason = \"client-side caching benchmark\"
staleness_budget = \"10s\"
near_cache_max_age = \"1s\"
$(family bench: 4)
ttl = \"1h\"
default_class = \"cached\"
[resp]
listen = \"127.0.0.1:$resp_port\"" "" warn
base="http://127.0.0.1:$STARTED_PORT"
curl -fsS --max-time 10 -X PUT --data-binary v1 "$base/v1/keys/bench:hot?version=1" >/dev/null ||
    die "publishing bench:hot failed"

# door_gets: the door's GETs so far.
door_gets() {
    curl -fsS --max-time 5 "$base/metrics" | awk '$1 == "hotsplit_resp_commands_total{command=\"get\"}" { printf "%d", $2 }'
}

# run_client py|node [nocache]: one reader for DURATION seconds; prints its reads per second.
run_client() {
    local out
    case "$1" in
        py) out=$(bounded $((DURATION + 30)) "$PYTHON" "$CLIENTS/pycache.py" "$resp_port" loop bench:hot "$DURATION" "${2:-}") ;;
        node) out=$(bounded $((DURATION + 30)) node "$CLIENTS/nodecache.js" "$resp_port" loop bench:hot "$DURATION" "${2:-}") ;;
    esac
    [ "$(tail -n1 <<<"$out")" = ok ] || die "$1 ${2:-cached} reader failed: $out"
    head -n1 <<<"$out" | jq -r --argjson seconds "$DURATION" '.reads / $seconds | floor'
}

declare -A rate gets_per_second
for lib in py node; do
    log "$lib: one reader, caching on, then off (${DURATION}s each)"
    rate[$lib-on]=$(run_client "$lib")
    rate[$lib-off]=$(run_client "$lib" nocache)
done

for lib in py node; do
    log "$lib: $PROCESSES readers at once, caching on (${DURATION}s)"
    before=$(door_gets)
    started=$SECONDS
    readers=()
    for reader in $(seq "$PROCESSES"); do
        run_client "$lib" >"$WORK/$lib-reader-$reader.out" &
        readers+=("$!")
        PIDS+=("$!")
    done
    # Only the readers: a bare `wait` would wait for hotsplit too.
    for pid in "${readers[@]}"; do
        wait "$pid" || true
        forget_pid "$pid"
    done
    for out in "$WORK/$lib"-reader-*.out; do
        grep -Eq '^[0-9]+$' "$out" || die "a $lib reader failed (see the log above)"
    done
    rm -f "$WORK/$lib"-reader-*.out
    after=$(door_gets)
    # Each reader's first read is not a re-read: left out.
    gets_per_second[$lib]=$(awk -v a="$after" -v b="$before" -v n="$PROCESSES" -v s="$DURATION" 'BEGIN { printf "%.1f", (a - b - n) / s }')
    log "$lib: $((after - before)) GETs at the door in $((SECONDS - started)) s"
done

cat <<REPORT

## Client-side caching through the Redis door ($(date -u +%Y-%m-%d), $(nproc) cores, load before $(cut -d' ' -f1-3 /proc/loadavg))

One hot key (\`bench:hot\`, 4 copies, a class with near_cache_max_age = 1 s), the embedded store,
${DURATION} s per run.

| Client | reads/s cached | reads/s uncached | ratio | target |
|---|---|---|---|---|
| redis-py 8.1 (CacheConfig) | ${rate[py-on]} | ${rate[py-off]} | $(ratio "${rate[py-on]}" "${rate[py-off]}")× | ≥ 50× |
| node-redis 5 (BasicClientSideCache) | ${rate[node-on]} | ${rate[node-off]} | $(ratio "${rate[node-on]}" "${rate[node-off]}")× | ≥ 50× |

| $PROCESSES processes at full speed, cached | door GETs/s for the key (after their first reads) | expected (one per lease per connection) |
|---|---|---|
| redis-py | ${gets_per_second[py]} | about $PROCESSES |
| node-redis | ${gets_per_second[node]} | about $PROCESSES |
REPORT

# shellcheck shell=bash
# The Redis-protocol door's part of scripts/bench-side-by-side.sh (part 6; sourced by it, uses its
# helpers and knobs): issue 22's targets, each beside its baseline in the same run.
#   - `redis-benchmark -c RESP_CONNECTIONS GET` of one published hot advisory key (`hot:1`, near
#     cache on) through hotsplit's RESP port, beside the same command against Redis directly,
#     against twemproxy (Debian's nutcracker) in front of the same Redis, and against the RESP
#     ceiling (benches/resp_ceiling.rs: the least a tokio server can do), at -P 1 and -P 16;
#     targets: ≥ 0.9× the ceiling at both depths, ahead of twemproxy at both;
#   - each server's CPU time per GET from /proc (utime + stime over the run's GETs); target at
#     -P 16: hotsplit ≤ redis-server;
#   - the same GET of a `primary`-class key (`prim:1`: no near cache, a Redis read per GET)
#     against twemproxy at -P 1 and -P 16; target ≥ 0.9× at both; and beside it the same GET
#     through a second instance with `store.direct_reads = false` (each read through fred's
#     per-command path), the direct connection's baseline;
#   - both again over 1,000 hot keys (`GET hot:__rand_int__` with `-r 1000`, each key published
#     first; twemproxy reads the same keys from Redis), and the hit over 1,000 keys of a class
#     whose near cache keeps entries 10 s (`warm:`): advisory's 125 ms bound makes 1,000 keys ×
#     8 copies a steady stream of refresh reads, which the 10 s class takes out of the figure;
#   - the publish latency: `SET alloc:1` through the RESP port (redis-benchmark -c 1) against the
#     HTTP publish of the same allocated family (wrk -c 1 PUT); target: RESP p50 ≤ 1.05× HTTP's.
# Rounds rotate the order of the sides (RESP_ROUNDS), and each side's median is reported. The
# value is RESP_VALUE_BYTES (64) bytes everywhere. Figures land in RESP_SECTION and RESP_SUMMARY.
#
# RESP_PROFILE=1 (needs `perf`): after the rounds, one more run of each hotsplit case (the
# near-cache hit at -P 1 and -P 16, the primary-class read at -P 1 and -P 16) under
# `perf record -F RESP_PROFILE_HZ` of hotsplit's process; `perf report --no-children --sort
# symbol` of each (self time per function, the shares of hotsplit's samples) goes to
# RESP_PROFILE_DIR/profile-<case>.txt (kept after the run), and into RESP_SECTION: the shares
# summed by part (the kernel, the allocator, memcpy/memcmp, clock reads, the door, the read
# path, metrics, fred, tokio and tracing) and the top RESP_PROFILE_TOP functions. Stacks are
# not asked for: the release build has no frame pointers, and a function's own share is what
# tells where a GET's CPU goes.

knob RESP_ROUNDS 3 1
knob RESP_REQUESTS 400000 50000
knob RESP_PIPELINED_REQUESTS 2000000 200000
knob RESP_CONNECTIONS 64 64
knob RESP_VALUE_BYTES 64 64
knob RESP_KEYS 1000 1000
knob RESP_PUBLISHES 20000 2000
knob RESP_PROFILE 0 0
knob RESP_PROFILE_HZ 4999 999
knob RESP_PROFILE_TOP 25 10
RESP_PROFILE_DIR=${RESP_PROFILE_DIR:-$ROOT/target/resp-profiles}

# profile_parts FILE: a perf report's self shares summed by part, as one markdown table row per
# part (largest first).
profile_parts() {
    grep -E '^ +[0-9.]+%' "$1" | awk '
        {
            share = $1; sub(/%/, "", share); line = $0
            if ($2 == "[k]") part = "kernel (syscalls, TCP, scheduling)"
            else if (line ~ /(mi_|_mi_|malloc|free|realloc)/) part = "allocator (mimalloc)"
            else if (line ~ /__mem(move|cpy|cmp|set)/) part = "memcpy / memcmp"
            else if (line ~ /(clock_gettime|read_tsc|Instant::now|SystemTime)/) part = "clock reads"
            else if (line ~ /prometheus/) part = "metrics"
            else if (line ~ /hotsplit::resp::/) part = "the Redis door (parse, run, encode)"
            else if (line ~ /hotsplit::(read|near|route|ops|key|affinity|session|tracking)/) part = "the read path (plan, near cache, floors, decide)"
            else if (line ~ /quick_cache/) part = "the read path (plan, near cache, floors, decide)"
            else if (line ~ /hotsplit::(store|heal|fleet)/) part = "the store path (copy read, health guard, session record)"
            else if (line ~ /(hash|Hasher|sip)/) part = "hashing"
            else if (line ~ /fred::|redis_protocol/) part = "fred (store client)"
            else if (line ~ /tokio::|mio::/) part = "tokio"
            else if (line ~ /tracing/) part = "tracing"
            else if (line ~ /(bytes::|futures_util|core::|alloc::|nom::|tokio_util|arc_swap)/) part = "futures, bytes, std"
            else part = "other"
            sum[part] += share
        }
        END { for (part in sum) printf "%.1f\t%s\n", sum[part], part }' |
        sort -rn | awk -F'\t' '{ printf "| %s | %s %% |\n", $2, $1 }'
}

# resp_profile NAME PORT PID PIPELINE KEY: redis-benchmark GET of KEY on PORT under perf record
# of PID; the report of its samples by function in $WORK/profile-NAME.txt, whose top lines are
# appended to $WORK/profiles.md.
resp_profile() {
    local name=$1 port=$2 pid=$3 pipeline=$4 key=$5 requests=$RESP_REQUESTS perf_pid
    [ "$pipeline" = 1 ] || requests=$RESP_PIPELINED_REQUESTS
    perf record -q -F "$RESP_PROFILE_HZ" -p "$pid" -o "$WORK/perf-$name.data" >"$WORK/perf-$name.log" 2>&1 &
    perf_pid=$!
    wait_for 10 test -s "$WORK/perf-$name.data" || die "perf record did not start; see $WORK/perf-$name.log"
    log "profiling: redis-benchmark -P $pipeline GET $key on hotsplit under perf record"
    rb_csv "$port" "$pipeline" "$requests" "$RESP_CONNECTIONS" GET "$key" >"$WORK/profile-$name.rps" ||
        die "redis-benchmark under perf failed"
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    mkdir -p "$RESP_PROFILE_DIR"
    perf report -i "$WORK/perf-$name.data" --no-children --sort symbol --stdio --percent-limit 0.05 2>/dev/null |
        sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//' \
            >"$RESP_PROFILE_DIR/profile-$name.txt" || die "perf report failed for $name"
    {
        printf '\n#### %s (-P %s, %s GETs/s under perf; %s)\n\n| part | share of samples |\n|---|---|\n' \
            "$name" "$pipeline" "$(cut -d' ' -f1 "$WORK/profile-$name.rps")" "$RESP_PROFILE_DIR/profile-$name.txt"
        profile_parts "$RESP_PROFILE_DIR/profile-$name.txt"
        printf '\n```\n'
        awk -v n="$RESP_PROFILE_TOP" '/^ +[0-9.]+%/ && shown++ < n' "$RESP_PROFILE_DIR/profile-$name.txt"
        printf '```\n'
    } >>"$WORK/profiles.md"
}

# rb_csv PORT PIPELINE REQUESTS CONNECTIONS COMMAND...: one redis-benchmark run, prints
# "rps p50_ms" from its --csv line.
rb_csv() {
    local port=$1 pipeline=$2 requests=$3 connections=$4
    shift 4
    bounded 600 redis-benchmark -h 127.0.0.1 -p "$port" -c "$connections" -n "$requests" -P "$pipeline" --csv "$@" |
        awk -F'","' 'NR == 2 { gsub(/"/, "", $2); gsub(/"/, "", $5); printf "%.0f %s\n", $2, $5 }'
}

# median of the numbers on stdin
median() { sort -n | awk '{a[NR] = $1} END { if (NR == 0) print "–"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.0f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# per_get_us TICKS GETS: CPU microseconds per GET.
per_get_us() { awk -v t="$1" -v n="$2" -v hz="$CLK_TCK" 'BEGIN { if (n == 0) print "–"; else printf "%.2f", 1e6 * t / hz / n }'; }

# resp_side NAME PORT PID PIPELINE KEY: one redis-benchmark GET run of KEY on PORT, appending
# "NAME PIPELINE rps us_per_get" to $WORK/resp-runs (PID's CPU over the run).
resp_side() {
    local name=$1 port=$2 pid=$3 pipeline=$4 key=$5 requests=$RESP_REQUESTS before after out keyspace=()
    [ "$pipeline" = 1 ] || requests=$RESP_PIPELINED_REQUESTS
    # A key with __rand_int__ is one of RESP_KEYS keys, each GET picking one at random.
    case $key in *__rand_int__*) keyspace=(-r "$RESP_KEYS") ;; esac
    before=$(pid_ticks "$pid")
    log "redis-benchmark -c $RESP_CONNECTIONS -P $pipeline -n $requests ${keyspace[*]} GET $key on $name (127.0.0.1:$port)"
    out=$(rb_csv "$port" "$pipeline" "$requests" "$RESP_CONNECTIONS" "${keyspace[@]}" GET "$key") || die "redis-benchmark on $name failed"
    after=$(pid_ticks "$pid")
    [ -n "$out" ] || die "redis-benchmark on $name printed no figure"
    printf '%s %s %s %s\n' "$name" "$pipeline" "${out%% *}" "$(per_get_us $((after - before)) "$requests")" >>"$WORK/resp-runs"
}

# resp_figure NAME PIPELINE rps|us: the median over the rounds.
resp_figure() {
    local column=3
    [ "$3" = rps ] || column=4
    awk -v n="$1" -v p="$2" -v c="$column" '$1 == n && $2 == p {print $c}' "$WORK/resp-runs" | median
}

# resp_spread NAME PIPELINE: the lowest and highest GETs/s over the rounds ("min–max").
resp_spread() {
    awk -v n="$1" -v p="$2" '$1 == n && $2 == p {
        if (lo == "" || $3 + 0 < lo + 0) lo = $3; if (hi == "" || $3 + 0 > hi + 0) hi = $3 }
        END { if (lo != "") printf "%s–%s", lo, hi }' "$WORK/resp-runs"
}

resp_part() {
    local port redis_pid value families hs_pid resp_port twem_port twem_pid ceiling_port ceiling_pid
    head -c "$RESP_VALUE_BYTES" /dev/zero | tr '\0' 'v' >"$WORK/resp-value.bin"
    value=$(cat "$WORK/resp-value.bin")
    start_redis resp-standalone
    port=$STARTED_PORT
    redis_pid=$STARTED_PID
    cli "$port" set hot:1 "$value" >/dev/null
    cli "$port" set prim:1 "$value" >/dev/null

    # twemproxy in front of the same Redis.
    free_port
    twem_port=$FREE_PORT
    free_port
    cat >"$WORK/nutcracker.yml" <<EOF
alpha:
  listen: 127.0.0.1:$twem_port
  hash: fnv1a_64
  distribution: ketama
  redis: true
  server_connections: 1
  servers:
   - 127.0.0.1:$port:1
EOF
    nutcracker -c "$WORK/nutcracker.yml" -s "$FREE_PORT" -a 127.0.0.1 -o "$WORK/nutcracker.log" -p "$WORK/nutcracker.pid" &
    twem_pid=$!
    PIDS+=("$twem_pid")
    wait_for 10 redis_ping "$twem_port" || die "twemproxy did not answer; see $WORK/nutcracker.log"

    # The RESP ceiling.
    free_port
    ceiling_port=$FREE_PORT
    "$RESP_CEILING_BIN" --listen "127.0.0.1:$ceiling_port" --value-bytes "$RESP_VALUE_BYTES" >"$WORK/resp-ceiling.log" 2>&1 &
    ceiling_pid=$!
    PIDS+=("$ceiling_pid")
    wait_for 10 redis_ping "$ceiling_port" || die "the RESP ceiling did not answer; see $WORK/resp-ceiling.log"

    # hotsplit with its RESP door: hot: (8 copies, advisory, near cache on), prim: (primary
    # class: every GET reads Redis), alloc: (allocated versions, for the publish latency).
    free_port
    resp_port=$FREE_PORT
    families="$(family hot: "$COPIES")
default_class = \"advisory\"
$(family prim: 1)
default_class = \"primary\"
$(family alloc: 1)
versioning = \"allocated\"
$(family warm: "$COPIES")
default_class = \"patient\"
[classes.patient]
route = \"replica\"
reason = \"the many-key hit: entries that live 10 s, so refreshes are rare\"
staleness_budget = \"20s\"
near_cache_max_age = \"10s\"
[resp]
listen = \"127.0.0.1:$resp_port\""
    start_hotsplit hotsplit-resp "redis://127.0.0.1:$port" "$families" "" warn
    hs_pid=$STARTED_PID
    local base="http://127.0.0.1:$STARTED_PORT"
    curl -fsS --max-time 10 -X PUT --data-binary "@$WORK/resp-value.bin" "$base/v1/keys/hot:1?version=1" >/dev/null ||
        die "publishing hot:1 failed"
    curl -fsS --max-time 10 -X PUT --data-binary "@$WORK/resp-value.bin" "$base/v1/keys/prim:1?version=1" >/dev/null ||
        die "publishing prim:1 failed"
    wait_for 20 redis_ping "$resp_port" || die "hotsplit's RESP port did not answer; see $WORK/hotsplit-resp.log"
    # The same primary-class read with store.direct_reads off (every read through the Redis
    # client's per-command path): the direct connection's baseline in the same run.
    local client_port client_pid
    free_port
    client_port=$FREE_PORT
    start_hotsplit hotsplit-resp-client "redis://127.0.0.1:$port" "[store]
direct_reads = false
$(family prim: 1)
default_class = \"primary\"
[resp]
listen = \"127.0.0.1:$client_port\"" "" warn
    client_pid=$STARTED_PID
    wait_for 20 redis_ping "$client_port" || die "the client-path hotsplit's RESP port did not answer; see $WORK/hotsplit-resp-client.log"
    # The same primary-class read on one worker thread (server.worker_threads = 1), as
    # twemproxy runs on one: what the second thread costs where the cores are shared with the
    # load generator and Redis.
    local one_port one_pid
    free_port
    one_port=$FREE_PORT
    start_hotsplit hotsplit-resp-1w "redis://127.0.0.1:$port" "$(family prim: 1)
default_class = \"primary\"
[resp]
listen = \"127.0.0.1:$one_port\"" "worker_threads = 1" warn
    one_pid=$STARTED_PID
    wait_for 20 redis_ping "$one_port" || die "the one-thread hotsplit's RESP port did not answer; see $WORK/hotsplit-resp-1w.log"
    # The many-key case's keys, as redis-benchmark -r names them (12 digits): in Redis for
    # twemproxy, published through the RESP port for hotsplit.
    local k
    for ((k = 0; k < RESP_KEYS; k++)); do
        printf 'SET hot:%012d %s\nSET prim:%012d %s\n' "$k" "$value" "$k" "$value"
    done | redis-cli -p "$port" >/dev/null || die "setting the $RESP_KEYS keys in Redis failed"
    for ((k = 0; k < RESP_KEYS; k++)); do
        printf 'HOTSPLIT.PUBLISH hot:%012d 1 %s\nHOTSPLIT.PUBLISH prim:%012d 1 %s\nHOTSPLIT.PUBLISH warm:%012d 1 %s\n' \
            "$k" "$value" "$k" "$value" "$k" "$value"
    done | redis-cli -p "$resp_port" >"$WORK/resp-publish-keys.txt" || die "publishing the $RESP_KEYS keys failed"
    grep -q ERR "$WORK/resp-publish-keys.txt" && die "publishing the $RESP_KEYS keys failed: $(grep -m1 ERR "$WORK/resp-publish-keys.txt")"
    local answer
    answer=$(redis-cli -p "$resp_port" GET hot:1)
    [ "$answer" = "$value" ] || die "GET hot:1 through the RESP port answered \"$answer\""

    : >"$WORK/resp-runs"
    local sides=("hotsplit $resp_port $hs_pid hot:1" "redis $port $redis_pid hot:1" "twemproxy $twem_port $twem_pid hot:1"
        "ceiling $ceiling_port $ceiling_pid hot:1" "hotsplit-primary $resp_port $hs_pid prim:1"
        "hotsplit-1k $resp_port $hs_pid hot:__rand_int__" "hotsplit-1k-10s $resp_port $hs_pid warm:__rand_int__"
        "twemproxy-1k $twem_port $twem_pid hot:__rand_int__"
        "hotsplit-primary-1k $resp_port $hs_pid prim:__rand_int__"
        "hotsplit-primary-client $client_port $client_pid prim:1"
        "hotsplit-primary-1w $one_port $one_pid prim:1")
    local round i n=${#sides[@]} pipeline side
    for ((round = 0; round < RESP_ROUNDS; round++)); do
        for pipeline in 1 16; do
            for ((i = 0; i < n; i++)); do
                side=${sides[$(((i + round) % n))]}
                read -r s_name s_port s_pid s_key <<<"$side"
                resp_side "$s_name" "$s_port" "$s_pid" "$pipeline" "$s_key"
            done
        done
    done

    : >"$WORK/profiles.md"
    if [ "$RESP_PROFILE" = 1 ]; then
        command -v perf >/dev/null || die "RESP_PROFILE=1 needs perf (apt-get install linux-perf)"
        resp_profile hit-p1 "$resp_port" "$hs_pid" 1 hot:1
        resp_profile hit-p16 "$resp_port" "$hs_pid" 16 hot:1
        resp_profile primary-p1 "$resp_port" "$hs_pid" 1 prim:1
        resp_profile primary-p16 "$resp_port" "$hs_pid" 16 prim:1
    fi

    # Publish latency: RESP SET against HTTP PUT, one connection each, rotating.
    cat >"$WORK/put.lua" <<EOF
wrk.method = "PUT"
wrk.body = "$value"
EOF
    local resp_p50s=() http_p50s=() out
    for ((round = 0; round < RESP_ROUNDS; round++)); do
        out=$(rb_csv "$resp_port" 1 "$RESP_PUBLISHES" 1 SET alloc:1 "$value") || die "redis-benchmark SET failed"
        resp_p50s+=("${out##* }")
        bounded 120 wrk -t1 -c1 -d"$DURATION" --latency -s "$WORK/put.lua" "$base/v1/keys/alloc:1" >"$WORK/wrk-put.txt" 2>&1 ||
            die "wrk PUT failed: $(cat "$WORK/wrk-put.txt")"
        http_p50s+=("$(wrk_field "$WORK/wrk-put.txt" p50)")
    done
    # wrk prints units (us, ms); redis-benchmark milliseconds.
    RESP_PUB_P50=$(printf '%s\n' "${resp_p50s[@]}" | awk '{printf "%.0f\n", $1 * 1000}' | median)
    HTTP_PUB_P50=$(printf '%s\n' "${http_p50s[@]}" | awk '/us$/ {sub(/us/, ""); printf "%.0f\n", $1} /ms$/ {sub(/ms/, ""); printf "%.0f\n", $1 * 1000} /[0-9]s$/ {sub(/s/, ""); printf "%.0f\n", $1 * 1e6}' | median)

    local hs1 hs16 r1 r16 t1 t16 c1 c16 p1 p16
    hs1=$(resp_figure hotsplit 1 rps) hs16=$(resp_figure hotsplit 16 rps)
    r1=$(resp_figure redis 1 rps) r16=$(resp_figure redis 16 rps)
    t1=$(resp_figure twemproxy 1 rps) t16=$(resp_figure twemproxy 16 rps)
    c1=$(resp_figure ceiling 1 rps) c16=$(resp_figure ceiling 16 rps)
    p1=$(resp_figure hotsplit-primary 1 rps) p16=$(resp_figure hotsplit-primary 16 rps)
    local pc1 pc16
    pc1=$(resp_figure hotsplit-primary-client 1 rps) pc16=$(resp_figure hotsplit-primary-client 16 rps)
    local pw1 pw16
    pw1=$(resp_figure hotsplit-primary-1w 1 rps) pw16=$(resp_figure hotsplit-primary-1w 16 rps)
    local k1 k16 kw1 kw16 kt1 kt16 kp1 kp16
    k1=$(resp_figure hotsplit-1k 1 rps) k16=$(resp_figure hotsplit-1k 16 rps)
    kw1=$(resp_figure hotsplit-1k-10s 1 rps) kw16=$(resp_figure hotsplit-1k-10s 16 rps)
    kt1=$(resp_figure twemproxy-1k 1 rps) kt16=$(resp_figure twemproxy-1k 16 rps)
    kp1=$(resp_figure hotsplit-primary-1k 1 rps) kp16=$(resp_figure hotsplit-primary-1k 16 rps)
    local hs_cpu16 redis_cpu16 hs_cpu1 tw_cpu1 hit1_verdict
    hs_cpu16=$(resp_figure hotsplit 16 us) redis_cpu16=$(resp_figure redis 16 us)
    hs_cpu1=$(resp_figure hotsplit 1 us) tw_cpu1=$(resp_figure twemproxy 1 us)
    # -P 1 is bound by the loopback round trip: at least 0.97× twemproxy, or no more CPU per GET.
    hit1_verdict=$(verdict "$(ratio "$hs1" "$t1")" 0.97 ">=")
    [ "$(verdict "$(ratio "$hs_cpu1" "$tw_cpu1")" 1 "<=")" = ok ] && hit1_verdict=ok
    local rows="" name pipeline
    for pipeline in 1 16; do
        for name in hotsplit redis twemproxy ceiling hotsplit-primary hotsplit-primary-client hotsplit-primary-1w hotsplit-1k hotsplit-1k-10s twemproxy-1k hotsplit-primary-1k; do
            rows+="| $name | -P $pipeline | $(resp_figure "$name" "$pipeline" rps) | $(resp_figure "$name" "$pipeline" us) |
"
        done
    done
    RESP_SECTION="### 6. The Redis-protocol door (redis-benchmark -c $RESP_CONNECTIONS GET, $RESP_VALUE_BYTES-byte value, median of $RESP_ROUNDS rotating rounds)

| Server | depth | GETs/s | server CPU µs per GET |
|---|---|---|---|
${rows}
- hotsplit: \`GET hot:1\` ($COPIES copies, advisory, near cache on) and \`GET prim:1\` (\`primary\` class: a Redis read each, on the direct connection) through \`[resp] listen\`; \`hotsplit-primary-client\` is the same \`GET prim:1\` on a second instance with \`store.direct_reads = false\`, \`hotsplit-primary-1w\` on a third with \`server.worker_threads = 1\` (one thread, as twemproxy; the others run one per CPU, the default); the \`-1k\` rows read $RESP_KEYS keys of each (\`-r $RESP_KEYS\`), \`-1k-10s\` of \`warm:\` (class \`patient\`: a 10 s max age, where advisory's is 125 ms, so each of its $((RESP_KEYS * COPIES)) entries is refreshed from Redis every 10 s, not every 125 ms); twemproxy (nutcracker, one server connection) and the ceiling (benches/resp_ceiling.rs) in front of / beside the same redis-server. twemproxy's CPU is its own (its Redis's apart).
- Publish p50, one connection: RESP \`SET alloc:1\` $RESP_PUB_P50 µs (redis-benchmark -c 1 -n $RESP_PUBLISHES), HTTP \`PUT /v1/keys/alloc:1\` $HTTP_PUB_P50 µs (wrk -c 1 -d $DURATION).
$(cat "$WORK/profiles.md")
"
    RESP_SUMMARY="| RESP GET (near cache) vs the RESP ceiling, -P 1 | $hs1 | $c1 | $(ratio "$hs1" "$c1")× | ≥ 0.9× — $(verdict "$(ratio "$hs1" "$c1")" 0.9 ">=") |
| RESP GET (near cache) vs the RESP ceiling, -P 16 | $hs16 | $c16 | $(ratio "$hs16" "$c16")× | ≥ 0.9× — $(verdict "$(ratio "$hs16" "$c16")" 0.9 ">=") |
| RESP GET (near cache) vs twemproxy, -P 1 (rounds; CPU µs per GET) | $hs1 ($(resp_spread hotsplit 1); $hs_cpu1 µs) | $t1 ($(resp_spread twemproxy 1); $tw_cpu1 µs) | $(ratio "$hs1" "$t1")× | ≥ 0.97× or CPU ≤ twemproxy's — $hit1_verdict |
| RESP GET (near cache) vs twemproxy, -P 16 | $hs16 | $t16 | $(ratio "$hs16" "$t16")× | > 1× — $(verdict "$(ratio "$hs16" "$t16")" 1 ">=") |
| RESP GET (near cache) vs Redis directly, -P 1 / -P 16 | $hs1 / $hs16 | $r1 / $r16 | $(ratio "$hs1" "$r1")× / $(ratio "$hs16" "$r16")× | – |
| CPU µs per GET at -P 16, hotsplit vs redis-server | $hs_cpu16 | $redis_cpu16 | $(ratio "$hs_cpu16" "$redis_cpu16")× | ≤ 1× — $(verdict "$(ratio "$hs_cpu16" "$redis_cpu16")" 1 "<=") |
| RESP GET (near cache), $RESP_KEYS keys, vs the RESP ceiling, -P 1 | $k1 | $c1 | $(ratio "$k1" "$c1")× | ≥ 0.9× — $(verdict "$(ratio "$k1" "$c1")" 0.9 ">=") |
| RESP GET (near cache), $RESP_KEYS keys, vs the RESP ceiling, -P 16 | $k16 | $c16 | $(ratio "$k16" "$c16")× | ≥ 0.9× — $(verdict "$(ratio "$k16" "$c16")" 0.9 ">=") |
| RESP GET (near cache, 10 s max age), $RESP_KEYS keys, vs the RESP ceiling, -P 1 | $kw1 | $c1 | $(ratio "$kw1" "$c1")× | ≥ 0.9× — $(verdict "$(ratio "$kw1" "$c1")" 0.9 ">=") |
| RESP GET (near cache, 10 s max age), $RESP_KEYS keys, vs the RESP ceiling, -P 16 | $kw16 | $c16 | $(ratio "$kw16" "$c16")× | ≥ 0.9× — $(verdict "$(ratio "$kw16" "$c16")" 0.9 ">=") |
| RESP GET, primary class, $RESP_KEYS keys, vs twemproxy ($RESP_KEYS keys), -P 1 | $kp1 | $kt1 | $(ratio "$kp1" "$kt1")× | ≥ 0.9× — $(verdict "$(ratio "$kp1" "$kt1")" 0.9 ">=") |
| RESP GET, primary class, $RESP_KEYS keys, vs twemproxy ($RESP_KEYS keys), -P 16 | $kp16 | $kt16 | $(ratio "$kp16" "$kt16")× | ≥ 0.9× — $(verdict "$(ratio "$kp16" "$kt16")" 0.9 ">=") |
| RESP GET, primary class (no near cache) vs twemproxy, -P 1 | $p1 | $t1 | $(ratio "$p1" "$t1")× | ≥ 0.9× — $(verdict "$(ratio "$p1" "$t1")" 0.9 ">=") |
| RESP GET, primary class (no near cache) vs twemproxy, -P 16 | $p16 | $t16 | $(ratio "$p16" "$t16")× | ≥ 0.9× — $(verdict "$(ratio "$p16" "$t16")" 0.9 ">=") |
| RESP GET, primary class, direct reads vs through the client (\`store.direct_reads = false\`), -P 1 / -P 16 | $p1 / $p16 | $pc1 / $pc16 | $(ratio "$p1" "$pc1")× / $(ratio "$p16" "$pc16")× | – |
| RESP GET, primary class, one worker thread (\`server.worker_threads = 1\`) vs twemproxy, -P 1 / -P 16 | $pw1 / $pw16 | $t1 / $t16 | $(ratio "$pw1" "$t1")× / $(ratio "$pw16" "$t16")× | (the default's target above) |
| Publish p50, RESP SET vs HTTP PUT (µs) | $RESP_PUB_P50 | $HTTP_PUB_P50 | $(ratio "$RESP_PUB_P50" "$HTTP_PUB_P50")× | ≤ 1.05× — $(verdict "$(ratio "$RESP_PUB_P50" "$HTTP_PUB_P50")" 1.05 "<=") |
"
    stop_pids "$hs_pid" "$twem_pid" "$ceiling_pid" "$redis_pid"
}

# shellcheck shell=bash
# The near cache's part of scripts/bench-side-by-side.sh (sourced by it; uses its helpers and
# knobs): issue 12's targets, each measured beside its baseline in the same run.
#   - the HTTP affine read of a hot `advisory` key answered from the near cache, against the
#     static HTTP ceiling (benches/proxy_baseline.rs's /v1/static route: the same axum server
#     answering the same bytes from memory); target ≥ 0.8×;
#   - the same read with the near cache off, against the minimal axum→fred GET proxy (the same
#     binary's /v1/keys route); target ≥ 0.9×;
#   - the Redis reads one hot key causes with the cache on, at fixed request rates (NEAR_RATES,
#     10000 and 50000 reads/s): wrk (scripts/wrk-affine.lua) pausing 8 ms after each answer on
#     rate / 125 connections, so each connection sends at most 125 requests/s; INFO commandstats
#     (cmdstat_hmget) before and after, against the bound N / (max age − source lag) per second;
#   - the instance's resident memory after a flood of distinct keys (FLOOD_KEYS keys with 64-byte
#     values, each read once) against near_cache.max_bytes + 64 MiB.
# The four throughput runs (the two ceilings and the two contenders) take NEAR_ROUNDS rounds,
# their order turning by one side each round; each side's figures are its median round's.
# Everything runs on a standalone redis-server of its own. The figures land in NEAR_SECTION and
# NEAR_SUMMARY (markdown) for the report.

knob NEAR_RATES "10000 50000" "10000 50000"
knob NEAR_ROUNDS 3 1
knob RATE_DURATION 10s 3s
knob FLOOD_KEYS 300000 50000
knob FLOOD_DURATION 30s 3s
# The near cache's defaults (src/near/config.rs, src/route/config.rs): the byte bound, and the
# advisory class's max age (half its 250 ms budget). The instances below run with them.
NEAR_MAX_BYTES=$((32 * 1024 * 1024))
NEAR_MAX_AGE_MS=125
# The pause wrk's rate script makes after each answer, and so each connection's most
# requests per second (1000 / pause).
RATE_PAUSE_MS=8

# Each wrk thread reads flood:<n> for its own share of n in 1..count (thread t of T takes
# n ≡ t mod T), each key once, then starts over.
cat >"$WORK/flood.lua" <<'EOF'
local threads = 0
function setup(thread)
    thread:set("thread_id", threads)
    threads = threads + 1
end
function init(args)
    count = tonumber(args[1])
    step = tonumber(args[2])
    n = thread_id + 1
end
function request()
    local path = "/v1/keys/flood:" .. n .. "?client=flood"
    n = n + step
    if n > count then n = n - count end
    return wrk.format("GET", path)
end
EOF

# metric BASE NAME: the value of the unlabelled counter NAME on BASE's /metrics (0 if absent).
metric() {
    curl -fsS --max-time 5 "$1/metrics" | awk -v name="$2" '$1 == name {v = $2} END {printf "%d\n", v + 0}'
}
# hmget_calls PORT: the HMGETs the redis-server on PORT has served.
hmget_calls() { cli "$1" info commandstats | awk -F'[:=,]' '$1 == "cmdstat_hmget" {print $3 + 0}'; }
# near_reads BASE: the Redis reads hotsplit's near cache started (misses, refreshes, floor reads).
near_reads() {
    echo $(($(metric "$1" hotsplit_near_cache_misses_total) + $(metric "$1" hotsplit_near_cache_refreshes_total) + $(metric "$1" hotsplit_near_cache_floor_reads_total)))
}
# spool NAME: a [heal] table giving the instance NAME a spool directory of its own under $WORK.
spool() { printf '[heal]\nspool_dir = "%s"\n' "$WORK/spool-$1"; }
per_second() { awk -v n="$1" -v s="$2" 'BEGIN {printf "%.1f", n / s}'; }

# measure_rate BASE REDIS_PORT RATE: wrk at about RATE reads/s of adv:1 on BASE for
# RATE_DURATION; appends "rate achieved hmget/s near-reads/s" to $WORK/near-rates.
measure_rate() {
    local base=$1 port=$2 rate=$3 connections calls_before reads_before started out seconds
    connections=$((rate * RATE_PAUSE_MS / 1000))
    [ "$connections" -ge "$THREADS" ] || connections=$THREADS
    out="$WORK/wrk-rate-$rate.txt"
    calls_before=$(hmget_calls "$port")
    reads_before=$(near_reads "$base")
    started=$EPOCHREALTIME
    log "wrk -t$THREADS -c$connections -d$RATE_DURATION (delay $RATE_PAUSE_MS ms: at most $rate req/s) on $base/v1/keys/adv:1"
    bounded 300 wrk -t"$THREADS" -c"$connections" -d"$RATE_DURATION" -s "$WRK_AFFINE_LUA" "$base" \
        -- "/v1/keys/adv:1?client=" "$CLIENT_IDS" "$RATE_PAUSE_MS" >"$out" 2>&1 || die "wrk failed: $(cat "$out")"
    seconds=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}')
    printf '%s %s %s %s %s\n' "$rate" "$(wrk_field "$out" rps)" \
        "$(per_second $(($(hmget_calls "$port") - calls_before)) "$seconds")" \
        "$(per_second $(($(near_reads "$base") - reads_before)) "$seconds")" \
        "$(wrk_field "$out" non2xx)" >>"$WORK/near-rates"
}

# median_round SIDE: copies SIDE's median round (by req/s; the lower middle one of an even
# count) to $WORK/wrk-SIDE.txt, sums its rounds' non-2xx answers into that copy's last line, and
# appends "SIDE: rate, rate, …" to NEAR_ROUND_RATES.
median_round() {
    local side=$1 round rates=() bad=0 count median
    for ((round = 1; round <= NEAR_ROUNDS; round++)); do
        rates+=("$(wrk_field "$WORK/wrk-$side-$round.txt" rps) $round")
        count=$(wrk_field "$WORK/wrk-$side-$round.txt" non2xx)
        bad=$((bad + ${count:-0}))
    done
    median=$(printf '%s\n' "${rates[@]}" | sort -n | awk -v n="${#rates[@]}" 'NR == int((n + 1) / 2) {print $2}')
    grep -v 'Non-2xx or 3xx responses:' "$WORK/wrk-$side-$median.txt" >"$WORK/wrk-$side.txt"
    [ "$bad" = 0 ] || printf '  Non-2xx or 3xx responses: %s\n' "$bad" >>"$WORK/wrk-$side.txt"
    NEAR_ROUND_RATES+="${NEAR_ROUND_RATES:+; }$side: $(printf '%s\n' "${rates[@]}" | awk '{print $1}' | paste -sd, - | sed 's/,/, /g')"
}

near_cache_part() {
    local port near_on off_pid off_base on_pid on_base static_base
    start_redis near-standalone
    port=$STARTED_PORT
    NEAR_REDIS_PID=$STARTED_PID
    near_on="$(family adv: "$COPIES")
default_class = \"advisory\""
    # Each instance has a spool of its own (two at once cannot share one).
    start_hotsplit hotsplit-near-on "redis://127.0.0.1:$port" "$near_on
$(spool near-on)"
    on_pid=$STARTED_PID
    on_base="http://127.0.0.1:$STARTED_PORT"
    start_hotsplit hotsplit-near-off "redis://127.0.0.1:$port" "$near_on
$(spool near-off)
[near_cache]
enabled = false"
    off_pid=$STARTED_PID
    off_base="http://127.0.0.1:$STARTED_PORT"
    publish_value "$on_base" adv:1 "$COPIES"
    cli "$port" -x set static:1 <"$WORK/value.bin" >/dev/null
    free_port
    static_base="http://127.0.0.1:$FREE_PORT"
    "$PROXY_BIN" --listen "127.0.0.1:$FREE_PORT" --redis "redis://127.0.0.1:$port" --static-key static:1 \
        >"$WORK/proxy-near.log" 2>&1 &
    local proxy_pid=$!
    PIDS+=("$proxy_pid")
    wait_for 20 curl -fsS --max-time 2 -o /dev/null "$static_base/v1/static/static:1" ||
        die "the proxy baseline did not answer; see $WORK/proxy-near.log"
    local answer
    answer=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code} %{size_download}' "$static_base/v1/static/static:1")
    [ "$answer" = "200 $VALUE_BYTES" ] || die "the static route answered \"$answer\", not \"200 $VALUE_BYTES\""
    # A first read through each instance: the near-on one fills its entry before the load.
    answer=$(curl -sS --max-time 5 -D - -o /dev/null "$on_base/v1/keys/adv:1?client=check")
    [[ "$answer" == *"source=near-cache"* ]] ||
        answer=$(curl -sS --max-time 5 -D - -o /dev/null "$on_base/v1/keys/adv:1?client=check")
    [[ "$answer" == *"source=near-cache"* ]] || die "a second read of adv:1 did not come from the near cache: $answer"

    # The four throughput runs, each ceiling beside its contender, in NEAR_ROUNDS rounds whose
    # order turns by one side each round (so drift is spread over every side); a side's figures
    # are its median round's.
    local sides=(static near-on proxy-near near-off) round at side
    for ((round = 1; round <= NEAR_ROUNDS; round++)); do
        for ((at = 0; at < ${#sides[@]}; at++)); do
            side=${sides[$(((at + round - 1) % ${#sides[@]}))]}
            case $side in
                static) run_wrk "$WORK/wrk-$side-$round.txt" "$static_base" "/v1/static/static:1?client=" "$CLIENT_IDS" "$DURATION" ;;
                near-on) run_wrk "$WORK/wrk-$side-$round.txt" "$on_base" "/v1/keys/adv:1?client=" "$CLIENT_IDS" "$DURATION" ;;
                proxy-near) run_wrk "$WORK/wrk-$side-$round.txt" "$static_base" "/v1/keys/static:1?client=" "$CLIENT_IDS" "$DURATION" ;;
                near-off) run_wrk "$WORK/wrk-$side-$round.txt" "$off_base" "/v1/keys/adv:1?client=" "$CLIENT_IDS" "$DURATION" ;;
            esac
        done
    done
    NEAR_ROUND_RATES=""
    for side in "${sides[@]}"; do
        median_round "$side"
    done
    STATIC_RPS=$(wrk_field "$WORK/wrk-static.txt" rps)
    NEAR_ON_RPS=$(wrk_field "$WORK/wrk-near-on.txt" rps)
    PROXY2_RPS=$(wrk_field "$WORK/wrk-proxy-near.txt" rps)
    NEAR_OFF_RPS=$(wrk_field "$WORK/wrk-near-off.txt" rps)
    NEAR_ON_HITS=$(metric "$on_base" hotsplit_near_cache_hits_total)
    NEAR_ON_BAD=$(wrk_field "$WORK/wrk-near-on.txt" non2xx)
    NEAR_OFF_BAD=$(wrk_field "$WORK/wrk-near-off.txt" non2xx)
    stop_pids "$proxy_pid" "$off_pid"

    # Redis reads of one hot key at fixed rates, cache on.
    : >"$WORK/near-rates"
    local rate
    for rate in $NEAR_RATES; do
        measure_rate "$on_base" "$port" "$rate"
    done
    stop_pids "$on_pid"

    # A flood of distinct keys, each read once, through an instance of its own.
    log "writing $FLOOD_KEYS keys flood:1..$FLOOD_KEYS (64-byte values) straight into Redis"
    local value64 expire_at
    value64=$(head -c 64 /dev/zero | tr '\0' 'f')
    expire_at=$((($(date +%s) + 3600) * 1000))
    # The copy's hash as hotsplit's compare-and-set writes it (src/store/redis/hotsplit.lua).
    cli "$port" eval "for n = 1, tonumber(ARGV[1]) do redis.call('HSET', 'flood:' .. n .. '#0', 'ver', '1', 'val', ARGV[2], 'tomb', '0', 'exp', ARGV[3]) end return 1" \
        0 "$FLOOD_KEYS" "$value64" "$expire_at" >/dev/null || die "filling flood:* failed"
    start_hotsplit hotsplit-flood "redis://127.0.0.1:$port" "$(family flood: 1)
default_class = \"advisory\"
$(spool flood)"
    local flood_pid=$STARTED_PID flood_base="http://127.0.0.1:$STARTED_PORT"
    answer=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code} %{size_download}' "$flood_base/v1/keys/flood:1?client=check")
    [ "$answer" = "200 64" ] || die "a read of flood:1 answered \"$answer\", not \"200 64\""
    log "wrk -t$THREADS -c$CONNECTIONS -d$FLOOD_DURATION: each of flood:1..$FLOOD_KEYS read in turn"
    bounded 300 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$FLOOD_DURATION" -s "$WORK/flood.lua" "$flood_base" \
        -- "$FLOOD_KEYS" "$THREADS" >"$WORK/wrk-flood.txt" 2>&1 || die "wrk failed: $(cat "$WORK/wrk-flood.txt")"
    FLOOD_READS=$(wrk_field "$WORK/wrk-flood.txt" requests)
    FLOOD_BAD=$(wrk_field "$WORK/wrk-flood.txt" non2xx)
    FLOOD_RSS_KB=$(awk '/^VmRSS:/ {print $2}' "/proc/$flood_pid/status")
    FLOOD_HWM_KB=$(awk '/^VmHWM:/ {print $2}' "/proc/$flood_pid/status")
    read -r FLOOD_ENTRIES FLOOD_BYTES < <(curl -fsS --max-time 5 "$flood_base/v1/near-cache" | jq -r '"\(.entries) \(.bytes)"')
    FLOOD_EVICTED=$(curl -fsS --max-time 5 "$flood_base/metrics" |
        awk '/^hotsplit_near_cache_evictions_total\{cause="capacity"\}/ {print $2 + 0}')
    stop_pids "$flood_pid" "$NEAR_REDIS_PID"
    near_report
}

# near_report: NEAR_SECTION and NEAR_SUMMARY from the figures of near_cache_part.
near_report() {
    local bound rows="" summary="" rate achieved hmget reads bad limit_mib flood_mib
    bound=$(awk -v n="$COPIES" -v age="$NEAR_MAX_AGE_MS" 'BEGIN {printf "%.1f", n / (age / 1000)}')
    while read -r rate achieved hmget reads bad; do
        rows+="| ≈ $rate reads/s (achieved $achieved) | $hmget | $reads | $bound | ${bad:-0} |
"
        summary+="| Redis reads of one hot key, cache on, ≈ $rate reads/s (HMGET/s vs N / max age) | $hmget /s | $bound /s | $(ratio "$hmget" "$bound")× | ≤ 1× — $(verdict "$(ratio "$hmget" "$bound")" 1 "<=") |
"
    done <"$WORK/near-rates"
    limit_mib=$(awk -v b="$NEAR_MAX_BYTES" 'BEGIN {printf "%.1f", b / 1048576 + 64}')
    flood_mib=$(mib "$FLOOD_RSS_KB")
    local on_ratio off_ratio
    on_ratio=$(ratio "$NEAR_ON_RPS" "$STATIC_RPS")
    off_ratio=$(ratio "$NEAR_OFF_RPS" "$PROXY2_RPS")
    NEAR_SECTION="### 2b. Near cache (standalone redis-server of its own; family \`adv:\`, $COPIES copies, class \`advisory\`: max age $NEAR_MAX_AGE_MS ms)

| Side | throughput | p50 / p99 |
|---|---|---|
| hotsplit affine read of \`adv:1\`, near cache on | $NEAR_ON_RPS req/s | $(wrk_field "$WORK/wrk-near-on.txt" p50) / $(wrk_field "$WORK/wrk-near-on.txt" p99) |
| static HTTP ceiling (axum answering the value from memory) | $STATIC_RPS req/s | $(wrk_field "$WORK/wrk-static.txt" p50) / $(wrk_field "$WORK/wrk-static.txt" p99) |
| hotsplit affine read of \`adv:1\`, near cache off | $NEAR_OFF_RPS req/s | $(wrk_field "$WORK/wrk-near-off.txt" p50) / $(wrk_field "$WORK/wrk-near-off.txt" p99) |
| minimal axum→fred GET proxy | $PROXY2_RPS req/s | $(wrk_field "$WORK/wrk-proxy-near.txt" p50) / $(wrk_field "$WORK/wrk-proxy-near.txt" p99) |

- Each side's figures are its median of $NEAR_ROUNDS rotating rounds (wrk -d$DURATION each); every round's req/s: $NEAR_ROUND_RATES.
- Near-cache hits during the runs: $NEAR_ON_HITS. Non-2xx answers (every round): on ${NEAR_ON_BAD:-0}, off ${NEAR_OFF_BAD:-0}.

Redis reads caused by \`adv:1\` with the cache on (wrk -t$THREADS -d$RATE_DURATION, rate / 125 connections, $RATE_PAUSE_MS ms pause after each answer; the bound is N / (max age − source lag) = $COPIES / ${NEAR_MAX_AGE_MS} ms, the source being the primary):

| Load | HMGET/s (INFO commandstats) | near-cache Redis reads/s (misses + refreshes + floor reads) | bound /s | non-2xx |
|---|---|---|---|---|
${rows}
Flood: $FLOOD_READS reads of distinct keys (flood:1..$FLOOD_KEYS, 64-byte values, wrk -c$CONNECTIONS -d$FLOOD_DURATION), non-2xx ${FLOOD_BAD:-0}: the cache held $FLOOD_ENTRIES entries, $FLOOD_BYTES bytes counted (max_bytes $NEAR_MAX_BYTES), $FLOOD_EVICTED evicted for capacity; hotsplit RSS $flood_mib MiB (peak $(mib "$FLOOD_HWM_KB")).
"
    NEAR_SUMMARY="| HTTP affine read, near cache on, vs the static HTTP ceiling | $NEAR_ON_RPS req/s | $STATIC_RPS req/s | ${on_ratio}× | ≥ 0.8× — $(verdict "$on_ratio" 0.8 ">=") |
| HTTP affine read, near cache off, vs minimal HTTP→Redis GET proxy | $NEAR_OFF_RPS req/s | $PROXY2_RPS req/s | ${off_ratio}× | ≥ 0.9× — $(verdict "$off_ratio" 0.9 ">=") |
${summary}| hotsplit RSS after a flood of distinct keys vs near_cache.max_bytes + 64 MiB | $flood_mib MiB | $limit_mib MiB | $(ratio "$flood_mib" "$limit_mib")× | < 1× — $(verdict "$(ratio "$flood_mib" "$limit_mib")" 1 "<=") |
"
}

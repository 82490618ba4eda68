# shellcheck shell=bash
# The hot-key detector's part of scripts/bench-side-by-side.sh (part 7; sourced by it, uses its
# helpers and knobs): the cost of detection on the near-cache hit path, A/B in one run. Two
# instances over the same standalone Redis, the same family (`adv:`, COPIES copies, advisory,
# near cache on), one with `[hot_keys]` at its defaults (one read in 16 sampled) and one with
# `hot_keys.enabled = false`; wrk reads `adv:1` from each in turn (HOT_ROUNDS rounds, the order
# rotating), and the medians are compared. Target: detection costs ≤ 3 %. Figures land in
# HOT_SECTION and HOT_SUMMARY.

knob HOT_ROUNDS 3 1

hot_part() {
    local port families on_pid on_base off_pid off_base round side out
    start_redis hot-standalone
    port=$STARTED_PORT
    families="$(family adv: "$COPIES")
default_class = \"advisory\""
    start_hotsplit hotsplit-hot-on "redis://127.0.0.1:$port" "$families" "" warn
    on_pid=$STARTED_PID
    on_base="http://127.0.0.1:$STARTED_PORT"
    start_hotsplit hotsplit-hot-off "redis://127.0.0.1:$port" "$families
[hot_keys]
enabled = false" "" warn
    off_pid=$STARTED_PID
    off_base="http://127.0.0.1:$STARTED_PORT"
    publish_value "$on_base" adv:1 "$COPIES"
    : >"$WORK/hot-runs"
    for ((round = 0; round < HOT_ROUNDS; round++)); do
        for side in $([ $((round % 2)) = 0 ] && echo "on off" || echo "off on"); do
            local base=$on_base
            [ "$side" = on ] || base=$off_base
            out="$WORK/wrk-hot-$side-$round.txt"
            run_wrk "$out" "$base" "/v1/keys/adv:1?client=" "$CLIENT_IDS" "$DURATION"
            printf '%s %s\n' "$side" "$(wrk_field "$out" rps)" >>"$WORK/hot-runs"
        done
    done
    local on off cost
    on=$(awk '$1 == "on" {print $2}' "$WORK/hot-runs" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    off=$(awk '$1 == "off" {print $2}' "$WORK/hot-runs" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    cost=$(awk -v a="$on" -v b="$off" 'BEGIN { if (b + 0 == 0) print "–"; else printf "%.1f", 100 * (b - a) / b }')
    local hot_view
    hot_view=$(curl -fsS --max-time 5 "$on_base/v1/hot-keys" | jq -c '.instance | {reads_per_s, top: .keys[0] | {key, rate, store_rate, hot}}' 2>/dev/null || echo "unavailable")
    HOT_SECTION="### 7. The hot-key detector's cost on the near-cache hit path (wrk -c$CONNECTIONS -d$DURATION, median of $HOT_ROUNDS rotating rounds)

| Side | reads/s (each round) | median |
|---|---|---|
| \`[hot_keys]\` defaults (1 in 16 sampled) | $(awk '$1 == "on" {printf "%s ", $2}' "$WORK/hot-runs") | $on |
| \`hot_keys.enabled = false\` | $(awk '$1 == "off" {printf "%s ", $2}' "$WORK/hot-runs") | $off |

- The detecting instance's \`/v1/hot-keys\` after the runs: \`$hot_view\`.
"
    HOT_SUMMARY="| Near-cache hit with hot-key detection vs without (cost in % of the off figure) | $on req/s | $off req/s | $(ratio "$on" "$off")× ($cost % cost) | ≤ 3 % — $(verdict "$cost" 3 "<=") |
"
    stop_pids "$on_pid" "$off_pid"
}

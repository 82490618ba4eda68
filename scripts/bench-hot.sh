# shellcheck shell=bash
# The hot-key detector's part of scripts/bench-side-by-side.sh (part 7; sourced by it, uses its
# helpers and knobs): the cost of detection on the near-cache hit path, A/B in one run. Two
# instances over the same standalone Redis, the same family (`adv:`, COPIES copies, advisory,
# near cache on), one with `[hot_keys]` at its defaults (one read in 16 sampled) and one with
# `hot_keys.enabled = false`; wrk reads `adv:1` from each in turn (HOT_ROUNDS rounds, the order
# rotating), and the medians are compared. Target: detection costs ≤ 3 %. Then (7b) the
# detector and the automatic split under a moving hotspot, benches/hot_moving.rs (its own 3x3
# cluster and two hotsplit processes; built by the script's `cargo bench --no-run`), whose
# markdown table is appended as it prints it. Figures land in HOT_SECTION and HOT_SUMMARY.

knob HOT_ROUNDS 3 1
# benches/hot_moving.rs: part 1's length (the moving hotspot) and any further arguments
# (--hot-every, --seed, --rate, --split-hold, --layout-interval, …; see the bench's header).
knob HOT_MOVING_DURATION 60s 16s
knob HOT_MOVING_ARGS "" "--split-hold 30s"

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
    hot_moving_part
}

# hot_moving_part: runs benches/hot_moving.rs and appends its table to HOT_SECTION and a row
# counting its met and missed targets to HOT_SUMMARY.
hot_moving_part() {
    local out="$WORK/hot-moving.md" args met missed
    read -ra args <<<"$HOT_MOVING_ARGS"
    log "benches/hot_moving.rs --duration $HOT_MOVING_DURATION ${args[*]} (its own 3x3 cluster, ~1.5 min)"
    if ! bounded 600 cargo bench --quiet --bench hot_moving -- --duration "$HOT_MOVING_DURATION" "${args[@]}" \
        >"$out" 2>"$WORK/hot-moving.err"; then
        log "benches/hot_moving.rs failed: $(tail -n 5 "$WORK/hot-moving.err")"
        KEEP_WORK=1
        HOT_SECTION+="
### 7b. The detector and the split under a moving hotspot: benches/hot_moving.rs failed (output kept in $WORK)
"
        return 0
    fi
    met=$(grep -c '| met |$' "$out" || true)
    missed=$(grep -c '| missed |$' "$out" || true)
    HOT_SECTION+="
### 7b. The detector and the split under a moving hotspot (benches/hot_moving.rs, --duration $HOT_MOVING_DURATION${HOT_MOVING_ARGS:+ $HOT_MOVING_ARGS})

$(sed '1{/^## /d}' "$out")
"
    HOT_SUMMARY+="| Moving hotspot and split (benches/hot_moving.rs, section 7b): targets met | $met of $((met + missed)) | – | – | all — $([ "$missed" = 0 ] && echo ok || echo MISSED) |
"
}

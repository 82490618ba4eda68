# shellcheck shell=bash
# The hot-key detector's part of scripts/bench-side-by-side.sh (part 7; sourced by it, uses its
# helpers and knobs): the cost of detection on the near-cache hit path, A/B in one run. Two
# instances over the same standalone Redis, the same family (`adv:`, COPIES copies, advisory,
# near cache on), one with `[hot_keys]` at its defaults (every read counted up to 4096 a
# second, one in k above) and one with `hot_keys.enabled = false`; wrk reads `adv:1` from each
# in turn (HOT_ROUNDS rounds; a round runs both sides back to back, which of them first
# alternating), and the verdict is taken on
# the median of the per-round ratios on ÷ off (what drifts between rounds cancels in a round's
# ratio; the two sides' medians are printed beside it). Target: detection costs ≤ 3 %. Wrk's
# rounds spread by about ±15 %, so (7a) the same read is measured in process too, without a
# socket: benches/http_hit.rs, whose `hotsplit` and `hotsplit_detect_off` sides are the two
# configs (HOT_HIT_ROUNDS paired rounds of HOT_HIT_REQUESTS requests over HOT_HIT_TASKS
# concurrent tasks, so the sampled reads contend for the detector's table lock), judged on its
# median of the per-round ratios of ns/request. Then (7b) the detector and the automatic split
# under a moving hotspot, benches/hot_moving/ (its own 3x3 cluster and two hotsplit
# processes; built by the script's `cargo bench --no-run`), whose markdown table is appended as
# it prints it. Figures land in HOT_SECTION and HOT_SUMMARY.
#
# Knobs of this part, full-run default [quick-run default]: HOT_ROUNDS=3 [1];
# HOT_HIT_ROUNDS=15 [2], HOT_HIT_REQUESTS=150000 [20000], HOT_HIT_TASKS=2 [2] (7a, ~45 s);
# HOT_MOVING_DURATION and HOT_MOVING_ARGS (7b, below).

knob HOT_ROUNDS 3 1
knob HOT_HIT_ROUNDS 15 2
knob HOT_HIT_REQUESTS 150000 20000
knob HOT_HIT_TASKS 2 2
# benches/hot_moving/: part 1's length (the moving hotspot) and any further arguments
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
            printf '%s %s %s\n' "$round" "$side" "$(wrk_field "$out" rps)" >>"$WORK/hot-runs"
        done
    done
    # Lines of $WORK/hot-runs: "round side req/s". Each round's on ÷ off, in round order.
    awk -v rounds="$HOT_ROUNDS" '$2 == "on" {on[$1] = $3} $2 == "off" {off[$1] = $3}
        END {for (r = 0; r < rounds; r++) if (off[r] + 0 > 0) printf "%.3f\n", on[r] / off[r]}' \
        "$WORK/hot-runs" >"$WORK/hot-paired"
    local on off paired cost medians_cost
    on=$(awk '$2 == "on" {print $3}' "$WORK/hot-runs" | hot_median)
    off=$(awk '$2 == "off" {print $3}' "$WORK/hot-runs" | hot_median)
    paired=$(hot_median <"$WORK/hot-paired")
    # The verdict's cost: how far the paired median falls below 1, in %. Beside it, the cost the
    # two medians alone would give.
    cost=$(awk -v p="$paired" 'BEGIN { if (p + 0 == 0) print "–"; else printf "%.1f", 100 * (1 - p) }')
    medians_cost=$(awk -v a="$on" -v b="$off" 'BEGIN { if (b + 0 == 0) print "–"; else printf "%.1f", 100 * (b - a) / b }')
    local hot_view
    hot_view=$(curl -fsS --max-time 5 "$on_base/v1/hot-keys" | jq -c '.instance | {reads_per_s, top: .keys[0] | {key, rate, store_rate, hot}}' 2>/dev/null || echo "unavailable")
    HOT_SECTION="### 7. The hot-key detector's cost on the near-cache hit path (wrk -c$CONNECTIONS -d$DURATION, $HOT_ROUNDS rounds, on and off back to back in each)

| Side | reads/s (each round) | median |
|---|---|---|
| \`[hot_keys]\` defaults (up to 4096 samples/s) | $(awk '$2 == "on" {printf "%s ", $3}' "$WORK/hot-runs") | $on |
| \`hot_keys.enabled = false\` | $(awk '$2 == "off" {printf "%s ", $3}' "$WORK/hot-runs") | $off |
| on ÷ off, paired by round | $(paste -sd' ' "$WORK/hot-paired") | $paired |

- Cost: $cost % (1 − the median of the per-round ratios: the verdict's figure); on the two
  medians alone, $(ratio "$on" "$off")× ($medians_cost %).
- The detecting instance's \`/v1/hot-keys\` after the runs: \`$hot_view\`.
"
    HOT_SUMMARY="| Near-cache hit with hot-key detection vs without, wrk (median of the per-round on ÷ off; cost in % of off) | $on req/s | $off req/s | ${paired:-–}× ($cost % cost) | ≤ 3 % — $(verdict "$cost" 3 "<=") |
"
    stop_pids "$on_pid" "$off_pid"
    hot_hit_part
    hot_moving_part
}

# hot_median: the median of the numbers on stdin, one a line (the lower middle of an even count;
# nothing when there are none).
hot_median() { sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}'; }

# hot_hit_figure NAME: the first figure of benches/http_hit.rs's line "http_hit/NAME: …".
hot_hit_figure() { awk -v name="http_hit/$1:" '$1 == name {print $2}' "$WORK/http-hit.txt"; }

# hot_hit_part: runs benches/http_hit.rs (7a: the near-cache hit in process, detection on and
# off in paired rounds over HOT_HIT_TASKS tasks) and appends its figures to HOT_SECTION and a
# row judging its median per-round ratio to HOT_SUMMARY.
hot_hit_part() {
    local args=(--rounds "$HOT_HIT_ROUNDS" --requests "$HOT_HIT_REQUESTS" --tasks "$HOT_HIT_TASKS")
    local on off paired cost rounds title
    title="benches/http_hit.rs ${args[*]}"
    log "$title (in process, ~45 s)"
    if ! bounded 600 cargo bench --quiet --bench http_hit -- "${args[@]}" \
        >"$WORK/http-hit.txt" 2>"$WORK/http-hit.err"; then
        log "benches/http_hit.rs failed: $(tail -n 5 "$WORK/http-hit.err")"
        KEEP_WORK=1
        HOT_SECTION+="
### 7a. The detector's cost in process: $title failed (output kept in $WORK)
"
        HOT_SUMMARY+="| Near-cache hit with hot-key detection vs without, in process (benches/http_hit.rs): failed | – | – | – | ≤ 3 % — – |
"
        return 0
    fi
    on=$(hot_hit_figure hotsplit)
    off=$(hot_hit_figure hotsplit_detect_off)
    paired=$(hot_hit_figure ratio/detect_on_vs_off)
    # The bench's own cost figure, (ratio − 1) × 100 of the unrounded ratio.
    cost=$(sed -n 's/^http_hit\/ratio\/detect_on_vs_off: .*cost \(-\{0,1\}[0-9.]*\) %.*/\1/p' "$WORK/http-hit.txt")
    if [ -z "$on" ] || [ -z "$off" ] || [ -z "$paired" ] || [ -z "$cost" ]; then
        log "unexpected output of benches/http_hit.rs: $(cat "$WORK/http-hit.txt")"
        KEEP_WORK=1
    fi
    # The per-round ratios, from the bench's round lines on stderr.
    rounds=$(sed -n 's/^http_hit: round .*detection on ÷ off \([0-9.]*\)$/\1/p' "$WORK/http-hit.err" | paste -sd' ')
    HOT_SECTION+="
### 7a. The detector's cost in process, without a socket ($title)

The near-cache hit as the listener serves it (\`http::app\`, no socket), with \`[hot_keys]\` at its
defaults and with \`hot_keys.enabled = false\` (each over a state of its own, on one \`redis-server\`),
each side as $HOT_HIT_TASKS concurrent tasks, a worker thread each; in each of the $HOT_HIT_ROUNDS rounds the
two sides run back to back. Time per request: wall time × tasks ÷ requests (the bench's header).

| Side | ns/request (median) |
|---|---|
| \`hotsplit\` (\`[hot_keys]\` defaults, up to 4096 samples/s) | ${on:-–} |
| \`hotsplit_detect_off\` | ${off:-–} |

- On ÷ off, each round: ${rounds:-–}; median ${paired:-–} ($(ratio "$on" "$off")× on the two medians alone).
- $(grep '^http_hit/ratio/detect_on_vs_off:' "$WORK/http-hit.txt" || echo 'no ratio line')
- $(grep '^http_hit/detector_observe:' "$WORK/http-hit.txt" || echo 'no detector_observe line')
"
    HOT_SUMMARY+="| Near-cache hit with hot-key detection vs without, in process (benches/http_hit.rs, $HOT_HIT_TASKS tasks; median of the per-round on ÷ off time per request; cost in % of off) | ${on:-–} ns | ${off:-–} ns | ${paired:-–}× (${cost:-–} % cost) | ≤ 3 % — $(verdict "$cost" 3 "<=") |
"
}

# hot_moving_part: runs benches/hot_moving/ and appends its table to HOT_SECTION and a row
# counting its met and missed targets to HOT_SUMMARY.
hot_moving_part() {
    local out="$WORK/hot-moving.md" args met missed
    read -ra args <<<"$HOT_MOVING_ARGS"
    log "benches/hot_moving/ --duration $HOT_MOVING_DURATION ${args[*]} (its own 3x3 cluster, ~1.5 min)"
    if ! bounded 600 cargo bench --quiet --bench hot_moving -- --duration "$HOT_MOVING_DURATION" "${args[@]}" \
        >"$out" 2>"$WORK/hot-moving.err"; then
        log "benches/hot_moving/ failed: $(tail -n 5 "$WORK/hot-moving.err")"
        KEEP_WORK=1
        HOT_SECTION+="
### 7b. The detector and the split under a moving hotspot: benches/hot_moving/ failed (output kept in $WORK)
"
        return 0
    fi
    met=$(grep -c '| met |$' "$out" || true)
    missed=$(grep -c '| missed |$' "$out" || true)
    HOT_SECTION+="
### 7b. The detector and the split under a moving hotspot (benches/hot_moving/, --duration $HOT_MOVING_DURATION${HOT_MOVING_ARGS:+ $HOT_MOVING_ARGS})

$(sed '1{/^## /d}' "$out")
"
    HOT_SUMMARY+="| Moving hotspot and split (benches/hot_moving/, section 7b): targets met | $met of $((met + missed)) | – | – | all — $([ "$missed" = 0 ] && echo ok || echo MISSED) |
"
}

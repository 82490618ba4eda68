#!/usr/bin/env bash
# Two builds of hotsplit side by side under Redis-protocol GET load, in interleaved rounds, beside
# the same redis-server read directly: for an A/B of a change to the Redis door or the core under
# it (the HTTP twin is scripts/bench-http-ab.sh).
#
#   scripts/bench-resp-ab.sh BEFORE_BIN AFTER_BIN [ROUNDS] [REQUESTS]
#
# BEFORE_BIN and AFTER_BIN are two `hotsplit` release binaries (copy target/release/hotsplit aside
# before the change). One redis-server of its own; each build serves the Redis protocol with two
# families: `adv:` (8 copies, class `advisory`: GETs answered by the near cache) and `pri:`
# (8 copies, class `primary`: every GET reaches Redis), a 64-byte value each. Sides: direct
# Redis, then each build's near-cache hit and primary read, each at -P 1 and -P 16
# (`redis-benchmark -c 64 -n REQUESTS`). Each round runs every side once, the order rotating by
# one each round; the output is each round's GET/s, then the medians and the after/before ratios
# with the round-to-round spread of each side. Run it at `nice -n -10` on an idle machine and note
# the load average it prints.
set -euo pipefail
BEFORE=$1 AFTER=$2 ROUNDS=${3:-5} REQUESTS=${4:-200000}
WORK=$(mktemp -d /tmp/hotsplit-resp-ab.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 1 100); do if "$@" >/dev/null 2>&1; then return 0; fi; sleep 0.2; done; return 1; }
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --dir "$WORK" --logfile "$WORK/redis.log" &
PIDS+=($!)
wait_for redis-cli -p "$RPORT" ping
VALUE=$(head -c 64 /dev/zero | tr '\0' 'v')
redis-cli -p "$RPORT" set direct:1 "$VALUE" >/dev/null
start() { # NAME BIN: starts BIN as NAME; sets RESP_NAME
    local name=$1 bin=$2 port resp
    port=$(free_port)
    resp=$(free_port)
    printf '[server]\nlisten = "127.0.0.1:%s"\n[resp]\nlisten = "127.0.0.1:%s"\n[heal]\nspool_dir = "%s"\n[[family]]\nprefix = "adv:"\ncopies = 8\ndefault_class = "advisory"\n[[family]]\nprefix = "pri:"\ncopies = 8\ndefault_class = "primary"\n' \
        "$port" "$resp" "$WORK/spool-$name" >"$WORK/$name.toml"
    HOTSPLIT_LOG=warn "$bin" serve --redis "redis://127.0.0.1:$RPORT" --config "$WORK/$name.toml" >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    eval "RESP_$name=$resp"
    wait_for curl -fsS --max-time 2 "http://127.0.0.1:$port/readyz" || { echo "$name not ready"; cat "$WORK/$name.log"; exit 1; }
}
start before "$BEFORE"
start after "$AFTER"
redis-cli -p "$RESP_before" HOTSPLIT.PUBLISH adv:1 1 "$VALUE" >/dev/null
redis-cli -p "$RESP_before" HOTSPLIT.PUBLISH pri:1 1 "$VALUE" >/dev/null
for n in before after; do
    p=RESP_$n
    [ "$(redis-cli -p "${!p}" GET adv:1)" = "$VALUE" ] || { echo "$n: adv:1 not readable"; exit 1; }
    [ "$(redis-cli -p "${!p}" GET pri:1)" = "$VALUE" ] || { echo "$n: pri:1 not readable"; exit 1; }
done
declare -A PORT KEY
PORT[direct]=$RPORT KEY[direct]=direct:1
for n in before after; do
    p=RESP_$n
    PORT[${n}_hit]=${!p} KEY[${n}_hit]=adv:1
    PORT[${n}_primary]=${!p} KEY[${n}_primary]=pri:1
done
SIDES=()
for depth in 1 16; do
    for s in direct before_hit after_hit before_primary after_primary; do SIDES+=("$s@P$depth"); done
done
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < ROUNDS; r++)); do
    line="round $((r + 1)):"
    for ((i = 0; i < ${#SIDES[@]}; i++)); do
        side=${SIDES[$(((i + r) % ${#SIDES[@]}))]}
        s=${side%@*} depth=${side#*@P}
        rps=$(timeout 600 redis-benchmark -h 127.0.0.1 -p "${PORT[$s]}" -c 64 -n "$REQUESTS" -P "$depth" --csv GET "${KEY[$s]}" |
            awk -F'"' 'NR == 2 {printf "%.0f", $4}')
        echo "$side $rps" >>"$WORK/rows"
        line+=" $side=$rps"
    done
    echo "$line"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
for side in "${SIDES[@]}"; do
    awk -v s="$side" '$1 == s {print $2}' "$WORK/rows" | sort -n |
        awk -v s="$side" '{r[NR] = $1} END {m = int((NR + 1) / 2); printf "median %s: %s GET/s (spread %.1f%%)\n", s, r[m], (r[NR] - r[1]) * 100 / r[m]}'
done | tee "$WORK/medians"
m() { awk -v s="$1" '$2 == s":" {print $3}' "$WORK/medians"; }
for depth in 1 16; do
    awk -v d="$depth" -v bh="$(m before_hit@P$depth)" -v ah="$(m after_hit@P$depth)" -v bp="$(m before_primary@P$depth)" -v ap="$(m after_primary@P$depth)" -v dr="$(m direct@P$depth)" \
        'BEGIN {printf "-P %s: hit after/before %.3f (%.2fx direct); primary after/before %.3f (%.2fx direct)\n", d, ah / bh, ah / dr, ap / bp, ap / dr}'
done

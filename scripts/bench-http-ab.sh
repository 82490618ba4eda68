#!/usr/bin/env bash
# Two builds of hotsplit side by side under the HTTP read load, in interleaved rounds, beside the
# ceilings of benches/proxy_baseline.rs: for an A/B of a change to the request path.
#
#   scripts/bench-http-ab.sh BEFORE_BIN AFTER_BIN PROXY_BIN [ROUNDS] [DURATION]
#
# BEFORE_BIN and AFTER_BIN are two `hotsplit` binaries (copy target/release/hotsplit aside before
# the change); PROXY_BIN is the proxy_baseline bench executable (`cargo bench --no-run --bench
# proxy_baseline`). One redis-server of its own; family `adv:` (8 copies, class `advisory`, a
# 512-byte value). Six sides: the static HTTP ceiling (/v1/static), the minimal axum->fred proxy,
# and each build with the near cache on and off. Each round runs every side once
# (`wrk -t2 -c64 -dDURATION -s scripts/wrk-affine.lua`, 32 client ids per thread), the order
# rotating by one each round; the output is each round's req/s with the server's voluntary
# context switches per request (all its threads, /proc/PID/task/*/status), then the medians and
# the two ratios of issue 12's targets. Run it at `nice -n -10` and note the load average it
# prints.
set -euo pipefail
BEFORE=$1 AFTER=$2 PROXY=$3 ROUNDS=${4:-3} DURATION=${5:-5s}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/hotsplit-ab.XXXXXX)
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
head -c 512 /dev/zero | tr '\0' 'v' >"$WORK/value.bin"
redis-cli -p "$RPORT" -x set static:1 <"$WORK/value.bin" >/dev/null
start() { # NAME BIN EXTRA_TOML: starts BIN as NAME; sets PORT_NAME and PID_NAME
    local name=$1 bin=$2 extra=$3 port
    port=$(free_port)
    printf '[server]\nlisten = "127.0.0.1:%s"\n[heal]\nspool_dir = "%s"\n[[family]]\nprefix = "adv:"\ncopies = 8\ndefault_class = "advisory"\n%s\n' \
        "$port" "$WORK/spool-$name" "$extra" >"$WORK/$name.toml"
    HOTSPLIT_LOG=info "$bin" serve --redis "redis://127.0.0.1:$RPORT" --listen "127.0.0.1:$port" --config "$WORK/$name.toml" >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    eval "PID_${name//-/_}=$!; PORT_${name//-/_}=$port"
    wait_for curl -fsS --max-time 2 "http://127.0.0.1:$port/readyz" || { echo "$name not ready"; cat "$WORK/$name.log"; exit 1; }
}
start before-on "$BEFORE" ""
start after-on "$AFTER" ""
start before-off "$BEFORE" $'[near_cache]\nenabled = false'
start after-off "$AFTER" $'[near_cache]\nenabled = false'
curl -fsS -X PUT --data-binary "@$WORK/value.bin" "http://127.0.0.1:$PORT_before_on/v1/keys/adv:1?version=1" >/dev/null
PPORT=$(free_port)
"$PROXY" --listen "127.0.0.1:$PPORT" --redis "redis://127.0.0.1:$RPORT" --static-key static:1 >"$WORK/proxy.log" 2>&1 &
PIDS+=($!)
PID_proxy=$!
wait_for curl -fsS --max-time 2 "http://127.0.0.1:$PPORT/v1/static/static:1"
for n in before_on after_on; do
    p=PORT_$n
    hit=0
    for _ in 1 2 3 4 5 6 7 8; do
        if curl -sS -D - -o /dev/null "http://127.0.0.1:${!p}/v1/keys/adv:1?client=check" | grep -q near-cache; then hit=1; break; fi
    done
    [ "$hit" = 1 ] || { echo "$n: no near-cache hit"; exit 1; }
done
ctx() { # PID: the voluntary context switches of all its threads
    cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ {s += $2} END {print s + 0}'
}
SIDES="static proxy before_on after_on before_off after_off"
declare -A URL PIDOF
URL[static]="http://127.0.0.1:$PPORT /v1/static/static:1?client="; PIDOF[static]=$PID_proxy
URL[proxy]="http://127.0.0.1:$PPORT /v1/keys/static:1?client="; PIDOF[proxy]=$PID_proxy
for n in before_on after_on before_off after_off; do
    p=PORT_$n; q=PID_$n
    URL[$n]="http://127.0.0.1:${!p} /v1/keys/adv:1?client="; PIDOF[$n]=${!q}
done
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
read -ra order <<<"$SIDES"
for ((r = 0; r < ROUNDS; r++)); do
    line="round $((r + 1)):"
    for ((i = 0; i < ${#order[@]}; i++)); do
        s=${order[$(((i + r) % ${#order[@]}))]}
        read -r base path <<<"${URL[$s]}"
        c0=$(ctx "${PIDOF[$s]}")
        wrk -t2 -c64 -d"$DURATION" -s "$ROOT/scripts/wrk-affine.lua" "$base" -- "$path" 32 >"$WORK/wrk-$s-$r.txt" 2>&1
        c1=$(ctx "${PIDOF[$s]}")
        rps=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$WORK/wrk-$s-$r.txt")
        reqs=$(awk '/requests in/ {print $1}' "$WORK/wrk-$s-$r.txt")
        non2xx=$(awk '/Non-2xx/ {print $NF}' "$WORK/wrk-$s-$r.txt")
        cs=$(awk -v a="$c0" -v b="$c1" -v n="$reqs" 'BEGIN {printf "%.3f", (b - a) / n}')
        echo "$s $rps $cs ${non2xx:-0}" >>"$WORK/rows"
        line+=" $s=$rps (cs/req $cs${non2xx:+ non2xx $non2xx})"
    done
    echo "$line"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
for s in $SIDES; do
    awk -v s="$s" '$1 == s {print $2, $3}' "$WORK/rows" | sort -n | awk -v s="$s" '{r[NR] = $1; c[NR] = $2} END {m = int((NR + 1) / 2); printf "median %s: %s req/s, %s cs/req\n", s, r[m], c[m]}'
done | tee "$WORK/medians"
m() { awk -v s="$1" '$2 == s":" {print $3}' "$WORK/medians"; }
awk -v a="$(m before_on)" -v b="$(m after_on)" -v st="$(m static)" -v bo="$(m before_off)" -v ao="$(m after_off)" -v p="$(m proxy)" \
    'BEGIN {printf "near on / static: before %.2f, after %.2f;  near off / proxy: before %.2f, after %.2f\n", a / st, b / st, bo / p, ao / p}'

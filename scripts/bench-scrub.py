#!/usr/bin/env python3
"""The anti-entropy scrub's cost in Redis commands, counted by Redis itself.

Starts a 3-master Redis Cluster (no replicas: the scrub reads and writes primaries only) and one
`hotsplit serve` whose family `scrub:` splits every key into COPIES copies, publishes KEYS keys
through the HTTP API, lets one scrub pass run over them (the copies are level, so it only reads),
then resets `INFO commandstats` on every master (CONFIG RESETSTAT), waits for the next pass to
finish, and sums every master's commandstats over that window: one scrub interval holding one
pass. It prints the commands of that window by command, the scrub's own (SCAN and HMGET), and
the average rate a pass costs over the default 5-minute `scrub.interval`, per 10,000 split keys.

Usage: scripts/bench-scrub.py [--binary target/release/hotsplit] [--keys 10000] [--copies 4]
                              [--interval 30s] [--rate 1000]

Every process it starts is killed by pid on exit; ports are picked free in 20000-30000 (the
cluster bus takes port + 10000), never 6379.
"""

import argparse
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

DEFAULT_INTERVAL_S = 300  # scrub.interval's default, "5m".


def free_port(taken):
    """A port P in 20000-30000 with P and P + 10000 free (a cluster node binds both)."""
    for _ in range(1000):
        port = random.randint(20000, 30000)
        if port in taken or port + 10000 in taken:
            continue
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        taken.update({port, port + 10000})
        return port
    sys.exit("bench-scrub: no free port")


def cli(port, *args):
    return subprocess.run(
        ["redis-cli", "-p", str(port), *args], check=True, capture_output=True, text=True, timeout=10
    ).stdout


def wait_for(what, condition, limit_s):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (OSError, subprocess.SubprocessError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.1)
    sys.exit(f"bench-scrub: {what} did not happen within {limit_s} s")


def get_json(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path)
    answer = connection.getresponse()
    body = answer.read()
    connection.close()
    if answer.status != 200:
        raise ValueError(f"GET {path}: {answer.status}")
    return json.loads(body)


def commandstats(port):
    """{command: calls} from INFO commandstats."""
    stats = {}
    for line in cli(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_"):].split(":", 1)
            calls = dict(field.split("=") for field in fields.split(","))["calls"]
            stats[name] = int(calls)
    return stats


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="target/release/hotsplit")
    parser.add_argument("--keys", type=int, default=10000)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--interval", default="30s", help="scrub.interval of the run (a pass must fit)")
    parser.add_argument("--rate", type=int, default=1000, help="scrub.max_keys_per_second")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="hotsplit-bench-scrub-")
    processes = []
    try:
        taken = set()
        masters = [free_port(taken) for _ in range(3)]
        for port in masters:
            node_dir = os.path.join(work, str(port))
            os.makedirs(node_dir)
            log = open(os.path.join(node_dir, "redis.log"), "w")
            processes.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000",
                 "--save", "", "--appendonly", "no", "--dir", node_dir],
                stdout=log, stderr=subprocess.STDOUT))
        for port in masters:
            wait_for(f"redis on {port}", lambda port=port: cli(port, "PING").strip() == "PONG", 10)
        subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in masters],
                        "--cluster-yes"], check=True, capture_output=True, timeout=30)
        wait_for("the cluster", lambda: all("cluster_state:ok" in cli(p, "CLUSTER", "INFO") for p in masters), 30)

        listen = free_port(taken)
        config = os.path.join(work, "hotsplit.toml")
        with open(config, "w") as out:
            out.write(
                f'[server]\nlisten = "127.0.0.1:{listen}"\n'
                f'[store]\nredis = "redis-cluster://' + ",".join(f"127.0.0.1:{p}" for p in masters) + '"\n'
                f'[heal]\nspool_dir = "{work}/spool"\n'
                f'[scrub]\ninterval = "{args.interval}"\nmax_keys_per_second = {args.rate}\n'
                f'[[family]]\nprefix = "scrub:"\ncopies = {args.copies}\nttl = "1h"\n')
        log = open(os.path.join(work, "hotsplit.log"), "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOTSPLIT_")}
        env["HOTSPLIT_LOG"] = "warn"
        processes.append(subprocess.Popen([args.binary, "serve", "--config", config],
                                          stdout=log, stderr=subprocess.STDOUT, env=env))
        wait_for("hotsplit /readyz", lambda: get_json(listen, "/readyz")["status"] == "ready", 60)

        started = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", listen, timeout=30)
        for key in range(args.keys):
            connection.request("PUT", f"/v1/keys/scrub:{key}?version=1", body=b"value")
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                sys.exit(f"bench-scrub: publishing scrub:{key} answered {answer.status}")
        connection.close()
        print(f"published {args.keys} keys x {args.copies} copies in {time.monotonic() - started:.1f} s",
              file=sys.stderr)

        # A whole pass that started after the last publish, then a window of exactly one more.
        def passes():
            return get_json(listen, "/v1/scrub")["passes"]

        first = passes()
        wait_for("a scrub pass over the published keys", lambda: passes() >= first + 2, 600)
        for port in masters:
            cli(port, "CONFIG", "RESETSTAT")
        window_start = time.monotonic()
        counted = passes()
        wait_for("the measured scrub pass", lambda: passes() >= counted + 1, 600)
        window_s = time.monotonic() - window_start
        totals = {}
        for port in masters:
            for name, calls in commandstats(port).items():
                totals[name] = totals.get(name, 0) + calls
        view = get_json(listen, "/v1/scrub")
        last = view["last"]
    finally:
        for process in processes:
            process.kill()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)

    total = sum(totals.values())
    per_10k = 10000 / max(last["keys_checked"], 1)
    print(f"window: {window_s:.1f} s (one scrub.interval = {args.interval}, one pass of "
          f"{last['duration_ms'] / 1000:.1f} s: {last['keys_checked']} keys checked, "
          f"{last['keys_scanned']} copy keys scanned, "
          f"{last['repaired_missing'] + last['repaired_behind']} repairs, complete={last['complete']})")
    print("| command | calls in the window (all masters) |")
    print("|---|---|")
    for name, calls in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"| {name} | {calls} |")
    print(f"| total | {total} |")
    # The scrub's own commands: a SCAN per page and an HMGET per copy (its lease FCALLs, one
    # per third of scrub.lease_ttl, are too few to matter and share FCALL with the live sets).
    # The rest is the instance's background (heartbeats, live sets, registry) over the window.
    scrub = totals.get("hmget", 0) + totals.get("scan", 0)
    print(f"the scrub's own (HMGET + SCAN): {scrub}; the rest of the window: {total - scrub}")
    print(f"per 10,000 split keys: {scrub * per_10k:.0f} scrub commands per pass; averaged over the "
          f"default {DEFAULT_INTERVAL_S} s interval: {scrub * per_10k / DEFAULT_INTERVAL_S:.0f} commands/s "
          f"(during the pass itself: {scrub * per_10k / (last['duration_ms'] / 1000):.0f} commands/s)")


if __name__ == "__main__":
    main()

# redis-py's client-side caching (CacheConfig, RESP3) against hotsplit's RESP port, for
# tests/integration/client_cache.rs and scripts/bench-client-cache.sh. Run as:
#   python pycache.py PORT loop KEY SECONDS [nocache]  read KEY for SECONDS, print {"reads", "value"}
#   python pycache.py PORT publish KEY COUNT           publish v1..vCOUNT, each read back at once
#                                                      (through this or another connection)
#   python pycache.py PORT monotonic KEY STOP_FILE     read KEY ("v<version>") until STOP_FILE
#                                                      exists; versions must never go back
#                                                      (error answers are counted)
# It prints one JSON line, then "ok". redis-py's cache is shared by its pool's connections and
# drains invalidations on its next command or cache hit (it checks the socket then);
# single-threaded use reuses one connection.
import json
import os
import sys
import time

import redis
from redis.cache import CacheConfig

port, mode, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cached = not (len(sys.argv) > 5 and sys.argv[5] == "nocache")
options = {"cache_config": CacheConfig()} if cached else {}
r = redis.Redis(host="127.0.0.1", port=port, protocol=3, **options)


def version(value):
    assert value is not None and value.startswith(b"v"), value
    return int(value[1:])


if mode == "loop":
    seconds = float(sys.argv[4])
    reads = 0
    value = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = r.get(key)
        reads += 1
    print(json.dumps({"reads": reads, "value": None if value is None else value.decode()}))
elif mode == "publish":
    # Every other publish goes through this very connection (its invalidation comes before the
    # publish's reply), the others through a second connection without a cache (the instance
    # answers a publish once the reading connection wrote the invalidation): either way the
    # next reads from the cache must answer the version just published.
    other = redis.Redis(host="127.0.0.1", port=port, protocol=3)
    for n in range(1, int(sys.argv[4]) + 1):
        publisher = r if n % 2 else other
        publisher.execute_command("HOTSPLIT.PUBLISH", key, n, f"v{n}")
        for _ in range(3):
            got = r.get(key)
            via = "the same" if n % 2 else "another"
            assert got == f"v{n}".encode(), f"published v{n} through {via} connection, then read {got!r}"
    print(json.dumps({"published": int(sys.argv[4])}))
elif mode == "monotonic":
    # An error answer (a store node that did not answer) is counted, never cached, and the
    # reader goes on, as a real one would.
    stop = sys.argv[4]
    reads, errors, last, seen = 0, 0, 0, set()
    while reads % 64 or not os.path.exists(stop):
        reads += 1
        try:
            got = version(r.get(key))
        except redis.ResponseError:
            errors += 1
            continue
        assert got >= last, f"read v{got} after v{last} (read {reads})"
        last = got
        seen.add(got)
    print(json.dumps({"reads": reads, "errors": errors, "last": last, "versions": len(seen)}))
else:
    raise SystemExit(f"unknown mode {mode}")
print("ok")

# Monotonic reads and read-your-writes through a redis-py pool of 8 connections: each version
# is published through one connection, then read by 16 concurrent GETs spread over the pool's
# connections, none of which named a client id. Run as: python pypool.py PORT KEY FIRST LAST
import sys
from concurrent.futures import ThreadPoolExecutor

import redis

port, key, first, last = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pool = redis.ConnectionPool(port=port, max_connections=8, protocol=3)
client = redis.Redis(connection_pool=pool)
seen = []
with ThreadPoolExecutor(max_workers=8) as workers:
    for version in range(first, last + 1):
        report = client.execute_command("HOTSPLIT.PUBLISH", key, version, f"v{version}")
        assert report[b"status"] in (b"done", b"queued"), report
        answers = list(workers.map(lambda _: client.get(key), range(16)))
        for answer in answers:
            got = int(answer.decode()[1:])
            assert got == version, f"published {version}, a pooled read answered {got}"
        seen.append(version)
opened = len(pool._available_connections) + len(pool._in_use_connections)
assert opened >= 2, f"the reads used {opened} connection(s)"
print(f"{len(seen)} versions, {opened} connections")
print("ok")

# redis-py against hotsplit's RESP port on a 3-master/3-replica cluster, RESP2 and RESP3:
# affinity per HOTSPLIT.CLIENT id equal to what GET /v1/affinity named (copies on different
# masters), an MGET of keys on different masters, EXISTS refused on a split family and answered
# on a one-copy family, TTL/PTTL, SET/DEL on an allocated family, and a pool of 8 connections
# reading every version it publishes. Run as: python pycluster.py PORT SPEC_JSON, where SPEC is
# {"affinity": [{"client", "key", "copy", "node"}], "spanning": [one-copy keys], "split": key,
#  "allocated": key, "pool": key}.
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import redis

port, spec = int(sys.argv[1]), json.loads(sys.argv[2])


def report(reply):
    """A map reply as a dict of str keys, whichever protocol answered it."""
    if isinstance(reply, dict):
        return {k.decode(): v for k, v in reply.items()}
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def refused(call, words):
    try:
        call()
    except redis.ResponseError as error:
        assert words in str(error), (words, str(error))
    else:
        raise AssertionError(f"no error: {words}")


for proto in (2, 3):
    r = redis.Redis(port=port, protocol=proto)
    assert r.ping() is True

    # Keys of a one-copy family whose copies live on different masters: one MGET spans them.
    spanning = spec["spanning"]
    for key in spanning:
        published = report(r.execute_command("HOTSPLIT.PUBLISH", key, proto, f"{key}@{proto}"))
        assert published["status"] == b"done", published
    missing = spanning[0] + "-none"
    assert r.mget(spanning + [missing]) == [f"{k}@{proto}".encode() for k in spanning] + [None]
    for key in spanning:
        read = report(r.execute_command("HOTSPLIT.READ", key))
        assert read["version"] == proto and read["value"] == f"{key}@{proto}".encode(), read

    # EXISTS decides on presence: refused on a split family, answered on a one-copy family.
    split = spec["split"]
    r.execute_command("HOTSPLIT.PUBLISH", split, proto, f"s{proto}")
    refused(lambda: r.exists(split), "can disagree on presence")
    assert r.exists(spanning[0], missing, spanning[1]) == 2
    assert r.ping() is True, "the connection goes on after a refusal"

    # TTL and PTTL: the served copy's remaining life of a 10-minute family; -2 when missing.
    pttl, ttl = r.pttl(split), r.ttl(split)
    assert 0 < pttl <= 600_000 and 0 < ttl <= 600 and abs(ttl - pttl / 1000) <= 1, (ttl, pttl)
    assert r.ttl(missing) == -2 and r.pttl(missing) == -2

    # SET and DEL on an allocated family; SET on a caller family names HOTSPLIT.PUBLISH.
    allocated = spec["allocated"]
    assert r.set(allocated, f"a{proto}") is True
    assert r.get(allocated) == f"a{proto}".encode()
    assert r.delete(allocated) == 1
    assert r.get(allocated) is None
    refused(lambda: r.set(split, "x"), "HOTSPLIT.PUBLISH")

    # Affinity: a connection with HOTSPLIT.CLIENT id reads the copy /v1/affinity names, from
    # the master it names; HOTSPLIT.READ ... CLIENT id on another connection does the same.
    published = set()
    for want in spec["affinity"]:
        if want["key"] not in published:
            r.execute_command("HOTSPLIT.PUBLISH", want["key"], proto, f"aff{proto}")
            published.add(want["key"])
        pinned = redis.Redis(port=port, protocol=proto)
        assert pinned.execute_command("HOTSPLIT.CLIENT", want["client"]) in (True, b"OK")
        for read in (
            report(pinned.execute_command("HOTSPLIT.READ", want["key"])),
            report(r.execute_command("HOTSPLIT.READ", want["key"], "CLIENT", want["client"])),
        ):
            assert read["copy"] == want["copy"], (want, read)
            assert read["served_by"] == f"{want['node']};role=primary".encode(), (want, read)
            assert read["value"] == f"aff{proto}".encode(), (want, read)
        assert pinned.get(want["key"]) == f"aff{proto}".encode()
        pinned.close()
    r.close()

# A pool of 8 connections, 16 concurrent GETs and an MGET after each publish: every one
# answers the version just published.
pool = redis.ConnectionPool(port=port, max_connections=8, protocol=3)
pooled = redis.Redis(connection_pool=pool)
key = spec["pool"]
with ThreadPoolExecutor(max_workers=8) as workers:
    for version in range(1, 11):
        pooled.execute_command("HOTSPLIT.PUBLISH", key, version, f"v{version}")
        answers = list(workers.map(lambda _: pooled.get(key), range(16)))
        assert answers == [f"v{version}".encode()] * 16, (version, answers)
        assert pooled.mget([key, spec["spanning"][0]])[0] == f"v{version}".encode()
opened = len(pool._available_connections) + len(pool._in_use_connections)
assert 2 <= opened <= 8, f"the pool opened {opened} connection(s)"
pool.disconnect()
print(f"pool: {opened} connections")
print("ok")

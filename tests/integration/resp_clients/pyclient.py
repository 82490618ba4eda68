# redis-py against hotsplit's RESP port: RESP2 and RESP3, pipelines with and without a
# transaction, a connection pool, and the refusals. Run as: python pyclient.py PORT
import sys

import redis

port = int(sys.argv[1])


def report(reply):
    """A HOTSPLIT.PUBLISH report as a dict, whichever protocol answered it."""
    if isinstance(reply, dict):
        return {k.decode(): v for k, v in reply.items()}
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


for proto in (2, 3):
    r = redis.Redis(port=port, protocol=proto)
    assert r.ping() is True
    key = f"hot:py{proto}"
    published = report(r.execute_command("HOTSPLIT.PUBLISH", key, 5, "v5"))
    assert published["status"] == b"done", published
    assert published["http_status"] == 200, published
    assert r.get(key) == b"v5"
    assert r.mget([key, "hot:none"]) == [b"v5", None]
    assert r.get("hot:none") is None
    ttl = r.pttl(key)
    assert 0 < ttl <= 600_000, ttl

    # A transaction (MULTI ... EXEC) and a plain pipeline.
    pipe = r.pipeline(transaction=True)
    pipe.set(f"alloc:py{proto}", "a")
    pipe.get(f"alloc:py{proto}")
    assert pipe.execute() == [True, b"a"]
    pipe = r.pipeline(transaction=False)
    pipe.get(key)
    pipe.get(f"alloc:py{proto}")
    pipe.execute_command("HOTSPLIT.PUBLISH", key, 6, "v6")
    pipe.get(key)
    answers = pipe.execute()
    assert answers[0] == b"v5" and answers[1] == b"a" and answers[3] == b"v6", answers

    # SET options are refused, DEL counts, SET on a caller family names HOTSPLIT.PUBLISH.
    for bad, words in (
        (lambda: r.set(f"alloc:py{proto}", "b", ex=10), "not supported"),
        (lambda: r.set(key, "x"), "HOTSPLIT.PUBLISH"),
        (lambda: r.execute_command("FOO", "a", "b"), "unknown command 'FOO', with args beginning with: 'a' 'b'"),
        (lambda: r.get("hot:{tag}"), "invalid key"),
        (lambda: r.execute_command("CLUSTER", "INFO"), "cluster support disabled"),
    ):
        try:
            bad()
        except redis.ResponseError as error:
            assert words in str(error), (words, str(error))
        else:
            raise AssertionError(f"no error: {words}")
    assert r.ping() is True, "the connection goes on after an error"
    assert r.delete(f"alloc:py{proto}") == 1
    assert r.get(f"alloc:py{proto}") is None

    # HOTSPLIT.READ answers a map (RESP3) or name, value pairs (RESP2).
    read = report(r.execute_command("HOTSPLIT.READ", key))
    assert read["value"] == b"v6" and read["version"] == 6, read
    r.close()

# A pool of 8 connections: every connection sees what any of them published.
pool = redis.ConnectionPool(port=port, max_connections=8)
pooled = redis.Redis(connection_pool=pool)
conns = [pool.get_connection() for _ in range(8)]
for conn in conns:
    pool.release(conn)
for version in range(1, 20):
    pooled.execute_command("HOTSPLIT.PUBLISH", "hot:pool", version, f"v{version}")
    for _ in range(8):
        assert pooled.get("hot:pool") == f"v{version}".encode()
assert len(pool._available_connections) + len(pool._in_use_connections) >= 1
pool.disconnect()
print("ok")

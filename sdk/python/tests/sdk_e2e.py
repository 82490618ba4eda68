"""The Python SDK against two hotsplit instances on a Redis Cluster whose replicas are held back
(run by tests/integration/sdk.rs, which starts them): read-your-writes through the other
instance with a session, the miss rate without one, 16 concurrent calls on one session, typed
errors, and a token handed to another process (printed as `handoff KEY TOKEN`). Ends with `ok`."""

import os
import sys
import threading

import redis

import hotsplit

A = int(os.environ["HOTSPLIT_A_PORT"])
B = int(os.environ["HOTSPLIT_B_PORT"])
RUN = os.environ["HOTSPLIT_RUN"]
ROUNDS = 100


def main() -> None:
    a, b = hotsplit.Client(port=A), hotsplit.Client(port=B, protocol=3)

    # With a session per user: a write through A is read through B every time.
    seen = 0
    for n in range(ROUNDS):
        user = a.session(client_id=f"user-{n % 7}")
        key = f"sdk:py:{RUN}:ryw:{n}"
        report = user.publish(key, 1, f"v{n}")
        assert report.status == "done", report
        # The other service goes on with the same scope's token.
        there = b.session(token=user.token, client_id=user.client_id)
        if there.read(key) == f"v{n}".encode():
            seen += 1
    # Without the SDK: plain redis-py, no session, the same write and read.
    plain_a, plain_b = redis.Redis(port=A), redis.Redis(port=B)
    missed = 0
    for n in range(ROUNDS):
        key = f"sdk:py:{RUN}:plain:{n}"
        plain_a.execute_command("HOTSPLIT.PUBLISH", key, 1, f"v{n}")
        read = plain_b.execute_command("HOTSPLIT.READ", key)
        if read is None or dict(zip(read[0::2], read[1::2])).get(b"value") != f"v{n}".encode():
            missed += 1
    print(f"python: with the session {seen}/{ROUNDS} seen; without it {missed}/{ROUNDS} missed")
    assert seen == ROUNDS, f"read-your-writes broke: {seen}/{ROUNDS}"
    assert missed > 0, "the replicas are not held back: the test could not fail"

    # 16 calls at once on one pooled session: each leaves its floor.
    pooled = a.session(client_id="pool")
    keys = [f"sdk:py:{RUN}:many:{n}" for n in range(16)]
    barrier = threading.Barrier(len(keys))
    errors = []

    def write(key: str) -> None:
        try:
            barrier.wait()
            pooled.publish(key, 1, "many")
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    there = b.session(token=pooled.token, client_id="pool")
    kept = sum(1 for key in keys if there.read(key) == b"many")
    print(f"python: 16 calls at once on one session, {kept}/16 floors kept")
    assert kept == 16, f"floors lost: {kept}/16"

    # The metadata of a read, read class, floor and client id per call.
    read = there.read(keys[0], meta=True)
    assert read.value == b"many" and read.version == 1, read
    assert read.served_by and "role=primary" in read.served_by, read
    assert read.route and read.route.startswith("class=advisory;"), read
    assert read.copy is not None and (read.age_ms is None or read.age_ms >= 0), read
    assert b.read(keys[0], read_class="primary", client_id="x", meta=True).version == 1
    try:
        b.read(keys[0], min_version=9)
        raise AssertionError("a floor above every copy must fail")
    except hotsplit.FloorError as error:
        assert error.prefix == "FLOOR", error
    try:
        a.publish("sdk:bad{key", 1, "x")
        raise AssertionError("an invalid key must fail")
    except hotsplit.InvalidError:
        pass
    # Every prefix has its type, whichever way redis-py hands the error over.
    from hotsplit.errors import from_redis

    exceptions = redis.exceptions
    for error, kind in [
        (exceptions.ResponseError("OVERLOADED in-flight bound"), hotsplit.OverloadedError),
        (exceptions.ResponseError("UNAVAILABLE node"), hotsplit.UnavailableError),
        (exceptions.ResponseError("DEADLINE passed"), hotsplit.DeadlineError),
        (exceptions.ResponseError("STALE over budget"), hotsplit.StaleError),
        (exceptions.ResponseError("FULL store"), hotsplit.FullError),
        (exceptions.NoPermissionError("this token lacks write"), hotsplit.NoPermError),
        (exceptions.AuthenticationError("Authentication required."), hotsplit.NoAuthError),
        (exceptions.ResponseError("WRONGPASS invalid"), hotsplit.WrongPassError),
    ]:
        mapped = from_redis(error)
        assert type(mapped) is kind and isinstance(mapped, hotsplit.HotsplitError), (error, mapped)
    timeout = exceptions.TimeoutError("timed out")
    assert from_redis(timeout) is timeout

    # Public get/set of the token; an invalidation carries it too.
    copy = a.session(token=pooled.token)
    assert copy.token == pooled.token
    gone = copy.invalidate(keys[1], 2)
    assert gone.status == "done", gone
    assert copy.token != pooled.token

    # A token handed to another process (the TypeScript test reads this key through B).
    handed = a.session(client_id="handoff")
    key = f"sdk:py:{RUN}:handoff"
    handed.publish(key, 1, "from python")
    print(f"handoff {key} {handed.token}")
    print("ok")


if __name__ == "__main__":
    main()
    sys.stdout.flush()

// The TypeScript SDK (the package built by tsc and installed from its tarball) against two
// hotsplit instances on a Redis Cluster whose replicas are held back (run by
// tests/integration/sdk.rs): read-your-writes through the other instance with a session, the
// miss rate without one, 16 concurrent calls on one session, typed errors, and a token handed
// over from the Python process (HOTSPLIT_HANDOFF_KEY, HOTSPLIT_HANDOFF_TOKEN). Ends with `ok`.
"use strict";
const assert = require("assert");
const Redis = require("ioredis");
const hotsplit = require("hotsplit");

const A = Number(process.env.HOTSPLIT_A_PORT);
const B = Number(process.env.HOTSPLIT_B_PORT);
const RUN = process.env.HOTSPLIT_RUN;
const ROUNDS = 100;

async function main() {
  const a = new hotsplit.Client({ port: A });
  const b = new hotsplit.Client(`redis://127.0.0.1:${B}`);

  // The token handed over by the Python process keeps its read-your-writes.
  const handed = b.session({ token: process.env.HOTSPLIT_HANDOFF_TOKEN, clientId: "handoff" });
  assert.strictEqual(await handed.read(process.env.HOTSPLIT_HANDOFF_KEY), "from python");
  console.log("typescript: the token from python read its write through the other instance");

  let seen = 0;
  for (let n = 0; n < ROUNDS; n++) {
    const user = a.session({ clientId: `user-${n % 7}` });
    const key = `sdk:ts:${RUN}:ryw:${n}`;
    const report = await user.publish(key, 1, `v${n}`);
    assert.strictEqual(report.status, "done");
    const there = b.session({ token: user.token, clientId: user.clientId });
    if ((await there.read(key)) === `v${n}`) seen++;
  }
  const plainA = new Redis({ port: A });
  const plainB = new Redis({ port: B });
  let missed = 0;
  for (let n = 0; n < ROUNDS; n++) {
    const key = `sdk:ts:${RUN}:plain:${n}`;
    await plainA.call("HOTSPLIT.PUBLISH", key, "1", `v${n}`);
    const read = await plainB.call("HOTSPLIT.READ", key);
    const value = Array.isArray(read) ? read[read.indexOf("value") + 1] : null;
    if (value !== `v${n}`) missed++;
  }
  console.log(`typescript: with the session ${seen}/${ROUNDS} seen; without it ${missed}/${ROUNDS} missed`);
  assert.strictEqual(seen, ROUNDS, "read-your-writes broke");
  assert.ok(missed > 0, "the replicas are not held back: the test could not fail");

  // 16 calls at once on one session (one pipelined connection): each leaves its floor.
  const pooled = a.session({ clientId: "pool" });
  const keys = Array.from({ length: 16 }, (_, n) => `sdk:ts:${RUN}:many:${n}`);
  await Promise.all(keys.map((key) => pooled.publish(key, 1, "many")));
  const there = b.session({ token: pooled.token, clientId: "pool" });
  let kept = 0;
  for (const key of keys) if ((await there.read(key)) === "many") kept++;
  console.log(`typescript: 16 calls at once on one session, ${kept}/16 floors kept`);
  assert.strictEqual(kept, 16, "floors lost");

  const read = await there.read(keys[0], { meta: true });
  assert.strictEqual(read.value, "many");
  assert.strictEqual(read.version, 1);
  assert.ok(read.servedBy.includes("role=primary"), read.servedBy);
  assert.ok(read.route.startsWith("class=advisory;"), read.route);
  assert.ok(read.ageMs === null || read.ageMs >= 0);
  assert.strictEqual((await b.read(keys[0], { readClass: "primary", clientId: "x", meta: true })).version, 1);
  await assert.rejects(b.read(keys[0], { minVersion: 9 }), (error) => error instanceof hotsplit.FloorError && error.prefix === "FLOOR");
  await assert.rejects(a.publish("sdk:bad{key", 1, "x"), hotsplit.InvalidError);
  const { ReplyError } = require("ioredis");
  for (const [prefix, Kind] of [
    ["OVERLOADED", hotsplit.OverloadedError],
    ["UNAVAILABLE", hotsplit.UnavailableError],
    ["DEADLINE", hotsplit.DeadlineError],
    ["STALE", hotsplit.StaleError],
    ["FULL", hotsplit.FullError],
    ["NOPERM", hotsplit.NoPermError],
    ["NOAUTH", hotsplit.NoAuthError],
    ["WRONGPASS", hotsplit.WrongPassError],
  ]) {
    const mapped = hotsplit.fromReply(new ReplyError(`${prefix} something`));
    assert.ok(mapped instanceof Kind && mapped instanceof hotsplit.HotsplitError, prefix);
    assert.strictEqual(mapped.prefix, prefix);
  }
  const other = new Error("connection closed");
  assert.strictEqual(hotsplit.fromReply(other), other);
  const copy = a.session({ token: pooled.token });
  assert.strictEqual(copy.token, pooled.token);
  assert.strictEqual((await copy.invalidate(keys[1], 2)).status, "done");
  assert.notStrictEqual(copy.token, pooled.token);

  for (const client of [plainA, plainB]) client.disconnect();
  await a.close();
  await b.close();
  console.log("ok");
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

// ioredis against hotsplit's RESP port, RESP2 and RESP3: its ready check (INFO), a publish, a
// read, MGET, a MULTI/EXEC, a pipeline, and an unknown command on a connection that goes on.
// Run as: node ioclient.js PORT
const Redis = require("ioredis");

const port = Number(process.argv[2]);

function assert(ok, what) {
  if (!ok) {
    throw new Error(`assertion failed: ${what}`);
  }
}

async function run(protocol) {
  const r = new Redis({ port, protocol, maxRetriesPerRequest: 0, enableOfflineQueue: true });
  const key = `hot:io${protocol}`;
  await r.call("HOTSPLIT.PUBLISH", key, "3", "x3");
  assert((await r.get(key)) === "x3", "get");
  const many = await r.mget(key, "hot:none");
  assert(many[0] === "x3" && many[1] === null, `mget ${JSON.stringify(many)}`);
  const tx = await r.multi().set(`alloc:io${protocol}`, "y").get(`alloc:io${protocol}`).exec();
  assert(tx[0][1] === "OK" && tx[1][1] === "y", `multi ${JSON.stringify(tx)}`);
  const piped = await r.pipeline().get(key).ping().exec();
  assert(piped[0][1] === "x3" && piped[1][1] === "PONG", `pipeline ${JSON.stringify(piped)}`);
  let refused = null;
  try {
    await r.call("FOO", "a");
  } catch (error) {
    refused = String(error.message);
  }
  assert(refused && refused.startsWith("ERR unknown command 'FOO'"), `unknown: ${refused}`);
  assert((await r.ping()) === "PONG", "ping after an error");
  assert((await r.del(`alloc:io${protocol}`)) === 1, "del");
  await r.quit();
}

(async () => {
  await run(2);
  await run(3);
  console.log("ok");
})().catch((error) => {
  console.error(error);
  process.exit(1);
});

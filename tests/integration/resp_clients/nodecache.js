// node-redis 5's client-side caching (BasicClientSideCache, RESP3) against hotsplit's RESP
// port, for tests/integration/client_cache.rs and scripts/bench-client-cache.sh. Run as
// `node nodecache.js PORT MODE KEY ARG [nocache]` with NODE_PATH naming a node_modules with
// `redis`; the modes are pycache.py's (loop, publish, monotonic) and `inflight` (below). It
// prints one JSON line, then "ok".
//
// Every read yields to the event loop first (setImmediate): node-redis answers a cache hit
// without I/O, so a loop of `await client.get(k)` alone never lets the event loop read the
// socket, and the invalidations hotsplit pushes are never processed. A client that does not
// read its socket cannot be told; a real reader (a server handling requests) yields.
'use strict';
const fs = require('fs');
const { createClient, BasicClientSideCache, ErrorReply } = require('redis');

const [port, mode, key, arg, flag] = process.argv.slice(2);
const cached = flag !== 'nocache';
const tick = () => new Promise((resolve) => setImmediate(resolve));

function version(value) {
  if (typeof value !== 'string' || !value.startsWith('v')) {
    throw new Error(`not a version: ${value}`);
  }
  return Number(value.slice(1));
}

async function connect(withCache) {
  const options = { socket: { host: '127.0.0.1', port: Number(port) }, RESP: 3 };
  if (withCache) options.clientSideCache = new BasicClientSideCache();
  const client = createClient(options);
  client.on('error', (error) => {
    console.error('client error', error);
    process.exitCode = 1;
  });
  await client.connect();
  return client;
}

async function loop(client) {
  const end = Date.now() + Number(arg) * 1000;
  let reads = 0;
  let value = null;
  while (Date.now() < end) {
    await tick();
    value = await client.get(key);
    reads += 1;
  }
  return { reads, value };
}

async function publish(client) {
  // As pycache.py: every other publish through this connection, the others through another
  // one without a cache; the next reads from the cache must answer the version just published.
  const other = await connect(false);
  const count = Number(arg);
  for (let n = 1; n <= count; n += 1) {
    const publisher = n % 2 ? client : other;
    await publisher.sendCommand(['HOTSPLIT.PUBLISH', key, String(n), `v${n}`]);
    for (let read = 0; read < 3; read += 1) {
      await tick();
      const got = await client.get(key);
      const via = n % 2 ? 'the same' : 'another';
      if (got !== `v${n}`) throw new Error(`published v${n} through ${via} connection, then read ${got}`);
    }
  }
  await other.quit();
  return { published: count };
}

async function monotonic(client) {
  // As pycache.py: an error answer is counted, and the reader goes on.
  let reads = 0;
  let errors = 0;
  let last = 0;
  const seen = new Set();
  while (reads % 64 || !fs.existsSync(arg)) {
    await tick();
    reads += 1;
    let value;
    try {
      value = await client.get(key);
    } catch (error) {
      if (!(error instanceof ErrorReply)) throw error;
      errors += 1;
      continue;
    }
    const got = version(value);
    if (got < last) throw new Error(`read v${got} after v${last} (read ${reads})`);
    last = got;
    seen.add(got);
  }
  return { reads, errors, last, versions: seen.size };
}

async function inflight(client) {
  // Connected, waits for the file ARG; then writes ARG.reading and reads until it reads v2, for
  // at most 20 s. The
  // test holds the first read in flight while every key is flushed (a null invalidation):
  // node-redis then empties its cache but keeps that read, and caches its answer.
  while (!fs.existsSync(arg)) await new Promise((resolve) => setTimeout(resolve, 5));
  // node-redis waits for a reconnect forever: a door gone (a failed test) must not hold this.
  setTimeout(() => process.exit(3), 30000).unref();
  const end = Date.now() + 20000;
  let reads = 0;
  let last = 0;
  const seen = new Set();
  while (last < 2 && Date.now() < end) {
    await tick();
    if (reads === 0) fs.writeFileSync(`${arg}.reading`, '');
    reads += 1;
    const got = version(await client.get(key));
    if (got < last) throw new Error(`read v${got} after v${last} (read ${reads})`);
    last = got;
    seen.add(got);
  }
  return { reads, last, versions: seen.size };
}

async function main() {
  const client = await connect(cached);
  const modes = { loop, publish, monotonic, inflight };
  if (!modes[mode]) throw new Error(`unknown mode ${mode}`);
  const result = await modes[mode](client);
  console.log(JSON.stringify(result));
  await client.quit();
  console.log('ok');
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

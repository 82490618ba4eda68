// A change published through instance B reaches a node-redis 5 client-side cache
// (BasicClientSideCache, RESP3) on instance A, never going back. Prints the delivery latencies
// and `ok`. The reader yields to the event loop between reads, as a server does: a loop that
// never yields never reads its socket, and no client can be told anything then.
//
// usage: node nodefeed.js A_PORT B_PORT KEY COUNT
const { createClient, BasicClientSideCache } = require("redis");

async function main() {

const [aPort, bPort, key, count] = process.argv.slice(2);
const cache = new BasicClientSideCache();
const a = createClient({ url: `redis://127.0.0.1:${aPort}`, RESP: 3, clientSideCache: cache });
const b = createClient({ url: `redis://127.0.0.1:${bPort}`, RESP: 3 });
await a.connect();
await b.connect();
const yieldNow = () => new Promise((resolve) => setImmediate(resolve));
const number = (value) => (value ? Number(value.split("-")[1]) : 0);
const WITHIN = 2500;

await b.set(key, "v-0");
await a.get(key);
let seen = 0;
const lat = [];
for (let i = 1; i <= Number(count); i++) {
  await b.set(key, `v-${i}`);
  const start = performance.now();
  for (;;) {
    const n = number(await a.get(key));
    if (n < seen) throw new Error(`the client cache went back: ${seen} then ${n}`);
    seen = n;
    if (n === i) break;
    if (performance.now() - start > WITHIN) throw new Error(`publish ${i} not seen within ${WITHIN} ms`);
    await yieldNow();
  }
  lat.push(performance.now() - start);
}
lat.sort((x, y) => x - y);
const pct = (p) => lat[Math.min(lat.length - 1, Math.floor(lat.length * p))];
console.log(`node-redis cache p50 ${pct(0.5).toFixed(1)} ms p99 ${pct(0.99).toFixed(1)} ms over ${count} publishes`);
await a.quit();
await b.quit();
console.log("ok");
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

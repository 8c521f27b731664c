// bench.mjs PORT [CLIENTS] [REQUESTS_PER_CLIENT] [MAX_TOKENS]: aggregate throughput of
// a running `strata serve` (127.0.0.1 only). Each client sends its requests one
// after another (greedy, fixed length: no end id, no stop), all clients at once.
// Prints requests/s, generated tokens/s and the mean time to first token.
const [port, clients = '1', per = '4', maxTok = '64'] = process.argv.slice(2);
const url = `http://127.0.0.1:${port}/v1/completions`;

async function one(i, k) {
  const t0 = performance.now();
  const r = await fetch(url, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: `client ${i} request ${k}: once upon a time`, max_tokens: Number(maxTok),
                           temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  let ttft = null, usage = null, buf = '';
  const dec = new TextDecoder();
  for await (const chunk of r.body) {
    if (ttft === null) ttft = performance.now() - t0;
    buf += dec.decode(chunk, { stream: true });
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const line = buf.slice(0, at); buf = buf.slice(at + 2);
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      const j = JSON.parse(line.slice(6));
      if (j.usage) usage = j.usage;
    }
  }
  return { ttft, tokens: usage ? usage.completion_tokens : 0 };
}

const t0 = performance.now();
const results = await Promise.all(Array.from({ length: Number(clients) }, async (_, i) => {
  const out = [];
  for (let k = 0; k < Number(per); k++) out.push(await one(i, k));
  return out;
}));
const s = (performance.now() - t0) / 1000;
const all = results.flat();
const tokens = all.reduce((a, r) => a + r.tokens, 0);
const ttft = all.reduce((a, r) => a + r.ttft, 0) / all.length;
console.log(`clients ${clients}: ${all.length} requests, ${tokens} tokens in ${s.toFixed(2)} s: ` +
            `${(all.length / s).toFixed(2)} req/s, ${(tokens / s).toFixed(1)} tok/s, mean TTFT ${ttft.toFixed(0)} ms`);

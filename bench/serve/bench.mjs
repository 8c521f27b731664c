// bench.mjs PORT [CLIENTS] [REQUESTS_PER_CLIENT] [MAX_TOKENS] [--csv FILE --label L]:
// aggregate throughput of a running `strata serve` (127.0.0.1 only). Each client
// sends its requests one after another (greedy, fixed length: no end id, no
// stop), all clients at once, every request streamed. Prints requests/s,
// generated tokens/s, time to first token (from sending the request) and the
// inter-token latency (between consecutive streamed tokens of a request), p50
// and p99; with --csv appends one row:
//   label,clients,requests,tokens,seconds,tokens_per_s,ttft_p50_s,ttft_p99_s,itl_p50_s,itl_p99_s
import { appendFileSync } from 'node:fs';

const args = process.argv.slice(2);
const opt = (name) => { const i = args.indexOf(name); if (i < 0) return null; const v = args[i + 1]; args.splice(i, 2); return v; };
const csv = opt('--csv'), label = opt('--label') || '';
const [port, clients = '1', per = '4', maxTok = '64'] = args;
const url = `http://127.0.0.1:${port}/v1/completions`;

async function one(i, k) {
  const t0 = performance.now();
  const r = await fetch(url, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: `client ${i} request ${k}: once upon a time`, max_tokens: Number(maxTok),
                           temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  let ttft = null, usage = null, buf = '', last = null;
  const gaps = [];
  const dec = new TextDecoder();
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const line = buf.slice(0, at); buf = buf.slice(at + 2);
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      const j = JSON.parse(line.slice(6));
      if (j.usage) usage = j.usage;
      if (!j.choices || !j.choices.length || !j.choices[0].text) continue;
      const now = performance.now();
      if (ttft === null) ttft = now - t0;
      else gaps.push(now - last);
      last = now;
    }
  }
  return { ttft, gaps, tokens: usage ? usage.completion_tokens : 0 };
}

function pct(xs, p) {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
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
const ttfts = all.map((r) => r.ttft / 1000), gaps = all.flatMap((r) => r.gaps.map((g) => g / 1000));
const f = (x) => x.toFixed(3);
console.log(`clients ${clients}: ${all.length} requests, ${tokens} tokens in ${s.toFixed(2)} s: ` +
            `${(all.length / s).toFixed(2)} req/s, ${(tokens / s).toFixed(2)} tok/s, TTFT p50 ${f(pct(ttfts, 50))} s p99 ${f(pct(ttfts, 99))} s, ` +
            `inter-token p50 ${f(pct(gaps, 50))} s p99 ${f(pct(gaps, 99))} s`);
if (csv)
  appendFileSync(csv, [label, clients, all.length, tokens, s.toFixed(3), (tokens / s).toFixed(4), f(pct(ttfts, 50)), f(pct(ttfts, 99)),
                       f(pct(gaps, 50)), f(pct(gaps, 99))].join(',') + '\n');

// chat2.mjs PORT [--csv FILE --label L] [--system-words N] [--max-tokens N]: a
// two-turn chat against a running `strata serve` (127.0.0.1 only), the second
// turn re-sending the history as clients do. For each turn: prompt tokens,
// prompt tokens restored from the prefix cache, time to first token, total time,
// and the bytes the server read from disk meanwhile (weights from /metrics'
// strata_read_bytes_total plus snapshot files). Appends rows to the CSV:
//   label,turn,prompt_tokens,cached_tokens,ttft_s,total_s,gb_read_weights,gb_read_snapshots,reply_hash
// The reply hash lets runs in different modes be compared (they must be equal).
import { appendFileSync } from 'node:fs';
import { createHash } from 'node:crypto';

const args = process.argv.slice(2);
const opt = (name, d) => { const i = args.indexOf(name); if (i < 0) return d; const v = args[i + 1]; args.splice(i, 2); return v; };
const csv = opt('--csv', null), label = opt('--label', ''), words = Number(opt('--system-words', '120')),
      maxTok = Number(opt('--max-tokens', '8'));
const [port] = args;
const base = `http://127.0.0.1:${port}`;

async function readBytes() {
  const t = await (await fetch(`${base}/metrics`)).text();
  let w = 0, p = 0;
  for (const l of t.split('\n')) {
    if (l.startsWith('strata_read_bytes_total{')) w += Number(l.split(' ').pop());
    if (l.startsWith('strata_prefix_disk_bytes_total{op="read"}')) p += Number(l.split(' ').pop());
  }
  return [w, p];
}

async function turn(messages) {
  const [w0, p0] = await readBytes();
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: maxTok, temperature: 0, reasoning_effort: 'none', stream: true,
                           stream_options: { include_usage: true } }),
  });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  let ttft = null, usage = null, buf = '', content = '';
  const dec = new TextDecoder();
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const line = buf.slice(0, at); buf = buf.slice(at + 2);
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      const j = JSON.parse(line.slice(6));
      if (j.usage) usage = j.usage;
      const d = j.choices && j.choices[0] && j.choices[0].delta;
      if (d && typeof d.content === 'string' && d.content) { if (ttft === null) ttft = performance.now() - t0; content += d.content; }
    }
  }
  const total = performance.now() - t0;
  const [w1, p1] = await readBytes();
  return { content, usage, ttft: (ttft ?? total) / 1000, total: total / 1000, gbw: (w1 - w0) / 1e9, gbp: (p1 - p0) / 1e9 };
}

const lorem = 'the river carries light over stones while the old town sleeps under a slow sky and ';
const system = { role: 'system', content: lorem.repeat(Math.ceil(words / 16)).split(' ').slice(0, words).join(' ') };
const u1 = { role: 'user', content: 'Tell me a short story about the river.' };
const t1 = await turn([system, u1]);
const t2 = await turn([system, u1, { role: 'assistant', content: t1.content }, { role: 'user', content: 'And what happens at night?' }]);
for (const [k, t] of [[1, t1], [2, t2]]) {
  const cached = t.usage.prompt_tokens_details ? t.usage.prompt_tokens_details.cached_tokens : 0;
  const h = createHash('sha256').update(t.content).digest('hex').slice(0, 12);
  console.log(`${label} turn ${k}: prompt ${t.usage.prompt_tokens} tokens (${cached} cached), first token ${t.ttft.toFixed(2)} s, ` +
              `total ${t.total.toFixed(2)} s, read ${t.gbw.toFixed(3)} GB of weights + ${t.gbp.toFixed(3)} GB of snapshots, reply ${h}`);
  if (csv)
    appendFileSync(csv, [label, k, t.usage.prompt_tokens, cached, t.ttft.toFixed(3), t.total.toFixed(3), t.gbw.toFixed(4), t.gbp.toFixed(4), h].join(',') + '\n');
}

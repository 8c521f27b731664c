// prefix.mjs PORT_A PORT_B KEY MODEL: prefix reuse and speculation through the
// official openai client (v4). Server A keeps prefix snapshots (RAM and
// --cache-dir); server B is fresh, has no prefix cache and speculates (--spec).
// A chat's second turn on A starts from the first turn's snapshot
// (usage.prompt_tokens_details.cached_tokens) and must equal B's answer to the
// same request; concurrent streams on B equal A's. Prints one line per check
// group and "ALL OK"; exits 1 on the first failure.
import OpenAI from 'openai';

const [portA, portB, key, model] = process.argv.slice(2);
const mk = (port) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
const A = mk(portA), B = mk(portB);

function check(cond, what, extra) {
  if (!cond) {
    console.log(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 800) : ''}`);
    process.exit(1);
  }
}

async function chatStream(client, params) {
  const s = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = '', reasoning = '', finish = null, usage = null;
  for await (const ch of s) {
    if (ch.usage) { usage = ch.usage; continue; }
    const d = ch.choices[0].delta;
    if (typeof d.content === 'string') content += d.content;
    if (typeof d.reasoning_content === 'string') reasoning += d.reasoning_content;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { content, reasoning, finish, usage };
}

async function chat(client, params, stream) {
  if (stream) return chatStream(client, params);
  const r = await client.chat.completions.create(params);
  const m = r.choices[0].message;
  return { content: m.content, reasoning: m.reasoning_content || '', finish: r.choices[0].finish_reason, usage: r.usage };
}

const cached = (u) => (u && u.prompt_tokens_details ? u.prompt_tokens_details.cached_tokens : -1);

async function metric(port, name) {
  const t = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const line = t.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.slice(name.length + 1)) : NaN;
}

// two-turn chats: greedy and sampled, thinking on and off, streamed and not
const cases = [
  [{ temperature: 0 }, false], [{ temperature: 0.8, seed: 11, top_p: 0.9 }, true],
  [{ temperature: 0, reasoning_effort: 'none' }, true], [{ temperature: 0.7, seed: 4, reasoning_effort: 'low' }, false],
];
let n = 0;
for (const [extra, stream] of cases) {
  const sys = { role: 'system', content: `You are assistant number ${n++}. Answer briefly.` };
  const u1 = { role: 'user', content: 'Tell me about the sea.' };
  const p1 = { model, messages: [sys, u1], max_tokens: 16, ...extra };
  const t1 = await chat(A, p1, stream);
  check(cached(t1.usage) === 0, 'turn 1: nothing cached', t1.usage);
  const asst = { role: 'assistant', content: t1.content };
  if (t1.reasoning) asst.reasoning_content = t1.reasoning;
  const p2 = { ...p1, messages: [sys, u1, asst, { role: 'user', content: 'And the fish?' }], max_tokens: 24 };
  const a = await chat(A, p2, stream);
  const b = await chat(B, p2, stream);
  check(cached(a.usage) >= t1.usage.prompt_tokens, 'turn 2 starts from turn 1 (cached_tokens >= turn 1 prompt)', [a.usage, t1.usage]);
  check(a.usage.prompt_tokens === b.usage.prompt_tokens && cached(a.usage) < a.usage.prompt_tokens, 'turn 2 prompt', [a.usage, b.usage]);
  check(cached(b.usage) === 0, 'server B has no prefix cache', b.usage);
  check(a.content === b.content && a.reasoning === b.reasoning && a.finish === b.finish &&
        a.usage.completion_tokens === b.usage.completion_tokens, 'turn 2 == a fresh server\'s answer', [a, b]);
}
console.log('ok two-turn chats == fresh server');
check(await metric(portA, 'strata_prefix_tokens_reused_total') > 0, 'A: tokens reused in /metrics');
check(await metric(portA, 'strata_prefix_lookups_total') >= cases.length * 2, 'A: lookups in /metrics');

// speculation on B: concurrent streams (text that repeats, so drafts are made) equal A's solo answers
{
  const reqs = [];
  for (let i = 0; i < 4; i++)
    reqs.push({ model, messages: [{ role: 'user', content: 'one two '.repeat(3 + i) }], max_tokens: 20 + 4 * i,
                temperature: i % 2 ? 0.9 : 0, seed: 50 + i, reasoning_effort: i % 2 ? 'none' : 'low' });
  const solo = [];
  for (const p of reqs) solo.push(await chatStream(A, p));
  const together = await Promise.all(reqs.map((p) => chatStream(B, p)));
  for (let i = 0; i < reqs.length; i++)
    check(together[i].content === solo[i].content && together[i].reasoning === solo[i].reasoning && together[i].finish === solo[i].finish,
          `speculating stream ${i} == plain`, [together[i], solo[i]]);
  check(await metric(portB, 'strata_spec_drafted_tokens_total') > 0, 'B: drafted tokens in /metrics');
}
console.log('ok speculation == plain');
console.log('ALL OK');

// client.mjs PORT KEY MODEL: drives a running `strata serve` with the official
// openai client (v4) and checks the response shapes itself (the client accepts
// almost any JSON). Prints one line per check group and "ALL OK" at the end;
// exits 1 on the first failure. Traffic goes to 127.0.0.1 only.
import OpenAI from 'openai';

const [port, key, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });

function check(cond, what, extra) {
  if (!cond) {
    console.log(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 600) : ''}`);
    process.exit(1);
  }
}
const isNum = (x) => Number.isInteger(x) && x >= 0;

function checkUsage(u, what) {
  check(u && isNum(u.prompt_tokens) && isNum(u.completion_tokens) && u.total_tokens === u.prompt_tokens + u.completion_tokens,
        `${what}: usage shape`, u);
  // prompt tokens the server's prefix cache restored instead of evaluating
  check(u.prompt_tokens_details && isNum(u.prompt_tokens_details.cached_tokens) &&
        u.prompt_tokens_details.cached_tokens < u.prompt_tokens, `${what}: usage.prompt_tokens_details`, u);
}
// usage without what depends on the cache's contents
const counts = (u) => [u.prompt_tokens, u.completion_tokens, u.total_tokens].join();

function checkChat(r, what, thinking) {
  check(typeof r.id === 'string' && r.id.startsWith('chatcmpl-'), `${what}: id`, r);
  check(r.object === 'chat.completion' && r.model === model && isNum(r.created), `${what}: object/model/created`, r);
  check(Array.isArray(r.choices) && r.choices.length === 1, `${what}: one choice`, r);
  const c = r.choices[0];
  check(c.index === 0 && c.message && c.message.role === 'assistant' && typeof c.message.content === 'string', `${what}: message`, c);
  check(['stop', 'length'].includes(c.finish_reason), `${what}: finish_reason`, c);
  if (thinking) check(typeof c.message.reasoning_content === 'string', `${what}: reasoning_content`, c);
  else check(c.message.reasoning_content === undefined, `${what}: no reasoning_content without thinking`, c);
  checkUsage(r.usage, what);
}

function checkCompletion(r, what) {
  check(typeof r.id === 'string' && r.id.startsWith('cmpl-') && r.object === 'text_completion' && r.model === model, `${what}: header`, r);
  check(Array.isArray(r.choices) && r.choices.length === 1 && typeof r.choices[0].text === 'string', `${what}: choice`, r);
  check(['stop', 'length'].includes(r.choices[0].finish_reason), `${what}: finish_reason`, r.choices[0]);
  checkUsage(r.usage, what);
}

// Streams a chat request; returns {content, reasoning, finish, usage, n}.
async function chatStream(params) {
  const s = await client.chat.completions.create({ ...params, stream: true });
  let content = '', reasoning = '', finish = null, usage = null, n = 0, sawRole = false, id = null;
  for await (const ch of s) {
    n++;
    check(ch.object === 'chat.completion.chunk' && ch.model === model && typeof ch.id === 'string', 'chunk header', ch);
    if (id === null) id = ch.id;
    check(ch.id === id, 'chunk ids equal', ch);
    check(Array.isArray(ch.choices), 'chunk choices', ch);
    if (ch.usage) { usage = ch.usage; check(ch.choices.length === 0, 'usage chunk has no choices', ch); continue; }
    check(ch.choices.length === 1 && ch.choices[0].index === 0, 'chunk has one choice', ch);
    check(finish === null, 'nothing after finish_reason but usage', ch);
    const d = ch.choices[0].delta;
    check(d && typeof d === 'object', 'chunk delta', ch);
    if (d.role) { check(!sawRole && n === 1 && d.role === 'assistant', 'role in the first chunk only', ch); sawRole = true; }
    if (typeof d.content === 'string') content += d.content;
    if (typeof d.reasoning_content === 'string') reasoning += d.reasoning_content;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  check(sawRole, 'first chunk carries the role');
  check(['stop', 'length'].includes(finish), 'stream finish_reason', finish);
  return { content, reasoning, finish, usage, n };
}

async function complStream(params) {
  const s = await client.completions.create({ ...params, stream: true });
  let text = '', finish = null, usage = null;
  for await (const ch of s) {
    check(ch.object === 'text_completion' && Array.isArray(ch.choices), 'completion chunk', ch);
    if (ch.usage) { usage = ch.usage; continue; }
    text += ch.choices[0].text;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { text, finish, usage };
}

async function expectError(fn, cls, status, what, param) {
  try {
    await fn();
  } catch (e) {
    check(e instanceof cls, `${what}: ${cls.name}`, { name: e.constructor.name, msg: String(e.message) });
    check(e.status === status, `${what}: status ${status}`, e.status);
    check(e.error && typeof e.error.message === 'string' && typeof e.error.type === 'string', `${what}: error shape`, e.error);
    if (param !== undefined) check(e.param === param, `${what}: param ${param}`, e.error);
    return;
  }
  check(false, `${what}: expected ${cls.name}`);
}

const msgs = (t) => [{ role: 'system', content: 'be brief' }, { role: 'user', content: t }];

// models
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model && models.data[0].object === 'model', 'models.list', models.data);
console.log('ok models');

// chat: non-streaming vs streaming (greedy and seeded sampling), thinking on and off
for (const [extra, thinking] of [[{ temperature: 0 }, true], [{ temperature: 0.9, seed: 7, top_p: 0.95 }, true],
                                 [{ temperature: 0, reasoning_effort: 'none' }, false],
                                 [{ temperature: 0.7, top_k: 40, min_p: 0.05, seed: 3, reasoning_effort: 'low' }, true]]) {
  const p = { model, messages: msgs('hello there'), max_tokens: 24, ...extra };
  const a = await client.chat.completions.create(p);
  checkChat(a, 'chat', thinking);
  check(a.usage.completion_tokens >= 1 && a.usage.completion_tokens <= 24, 'chat max_tokens', a.usage);
  const b = await chatStream({ ...p, stream_options: { include_usage: true } });
  check(b.content === a.choices[0].message.content, 'stream content == non-stream', [b.content, a.choices[0].message.content]);
  check(b.reasoning === (a.choices[0].message.reasoning_content || ''), 'stream reasoning == non-stream', [b.reasoning, a.choices[0].message.reasoning_content]);
  check(b.finish === a.choices[0].finish_reason, 'stream finish == non-stream');
  checkUsage(b.usage, 'stream usage');
  check(counts(b.usage) === counts(a.usage), 'stream usage == non-stream', [b.usage, a.usage]);
  const c = await chatStream(p);
  check(c.usage === null, 'no usage chunk without include_usage');
}
console.log('ok chat + stream');

// completions: string prompt and id prompt, stream and not
const c1 = await client.completions.create({ model, prompt: 'The quick brown fox', max_tokens: 40, temperature: 0 });
checkCompletion(c1, 'completion');
const c1s = await complStream({ model, prompt: 'The quick brown fox', max_tokens: 40, temperature: 0, stream_options: { include_usage: true } });
check(c1s.text === c1.choices[0].text && c1s.finish === c1.choices[0].finish_reason, 'completion stream == non-stream', [c1s, c1.choices[0]]);
checkUsage(c1s.usage, 'completion stream usage');
const c2 = await client.completions.create({ model, prompt: [1, 2, 3, 4], max_tokens: 8, temperature: 0 });
checkCompletion(c2, 'completion ids');
check(c2.usage.prompt_tokens === 4, 'id prompt counted', c2.usage);
console.log('ok completions');

// stop strings: cut at the first occurrence of an ASCII pair of the greedy text
{
  const base = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 120, temperature: 0 });
  const t = base.choices[0].text;
  let stop = null;
  for (let i = 2; i + 2 <= t.length && !stop; i++) if (/^[A-Za-z0-9]{2}$/.test(t.slice(i, i + 2))) stop = t.slice(i, i + 2);
  check(stop !== null, 'greedy text has an ASCII pair to stop on', t);
  const want = t.slice(0, t.indexOf(stop));
  const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 120, temperature: 0, stop: [stop, 'zzzzzz'] });
  check(r.choices[0].text === want && r.choices[0].finish_reason === 'stop', 'stop string cuts the text', [stop, want, r.choices[0]]);
  const rs = await complStream({ model, prompt: 'Once upon a time', max_tokens: 120, temperature: 0, stop });
  check(rs.text === want && rs.finish === 'stop', 'stop string (stream)', [stop, want, rs]);
  check(r.usage.completion_tokens < base.usage.completion_tokens || base.choices[0].finish_reason === 'stop', 'stop frees the sequence early', [r.usage, base.usage]);
}
console.log('ok stop strings');

// errors arrive as typed exceptions with the OpenAI error shape
await expectError(() => client.chat.completions.create({ model, messages: msgs('x'), temperature: 5 }), OpenAI.BadRequestError, 400, 'temperature', 'temperature');
await expectError(() => client.chat.completions.create({ model, messages: [] }), OpenAI.BadRequestError, 400, 'empty messages', 'messages');
await expectError(() => client.chat.completions.create({ model, messages: msgs('x'), n: 17 }), OpenAI.BadRequestError, 400, 'n=17', 'n');
await expectError(() => client.chat.completions.create({ model, messages: msgs('x'), presence_penalty: 1 }), OpenAI.BadRequestError, 400, 'presence_penalty', 'presence_penalty');
await expectError(() => client.chat.completions.create({ model, messages: msgs('x'), logprobs: true, top_logprobs: 21 }), OpenAI.BadRequestError, 400, 'top_logprobs', 'top_logprobs');
await expectError(() => client.chat.completions.create({ model, messages: msgs('x'), reasoning_effort: 'extreme' }), OpenAI.BadRequestError, 400, 'reasoning_effort', 'reasoning_effort');
await expectError(() => client.chat.completions.create({ model, messages: msgs('x'), max_tokens: 100000000 }), OpenAI.BadRequestError, 400, 'max_tokens over the context', 'max_tokens');
await expectError(() => client.chat.completions.create({ model: 'no-such-model', messages: msgs('x') }), OpenAI.NotFoundError, 404, 'unknown model', 'model');
await expectError(() => client.completions.create({ model, prompt: [1, 2, 999999] }), OpenAI.BadRequestError, 400, 'id outside the vocabulary', 'prompt');
await expectError(() => client.chat.completions.create({ model, messages: msgs('x'), max_tokens: 4, bogus_field: 1 }), OpenAI.BadRequestError, 400, 'unknown field', 'bogus_field');
const bad = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key + 'x', maxRetries: 0 });
await expectError(() => bad.models.list(), OpenAI.AuthenticationError, 401, 'wrong key');
await expectError(() => bad.chat.completions.create({ model, messages: msgs('x') }), OpenAI.AuthenticationError, 401, 'wrong key (chat)');
console.log('ok errors');

// what clients send by default is accepted (issue 42); n choices and logprobs, streamed and not
{
  const r = await client.chat.completions.create({ model, messages: msgs('x'), max_tokens: 4, response_format: { type: 'text' }, tools: [],
    tool_choice: 'none', parallel_tool_calls: true, store: false, metadata: { k: 'v' }, user: 'u', reasoning_effort: 'medium',
    n: 2, seed: 9, temperature: 0.8, logprobs: true, top_logprobs: 2 });
  check(r.choices.length === 2 && r.choices[1].index === 1 && r.seed === 9 && typeof r.system_fingerprint === 'string', 'n = 2 answer', r);
  check(r.usage.completion_tokens_details && isNum(r.usage.completion_tokens_details.reasoning_tokens), 'reasoning_tokens', r.usage);
  const s = await client.chat.completions.create({ model, messages: msgs('x'), max_tokens: 4, n: 2, seed: 9, temperature: 0.8,
    reasoning_effort: 'medium', stream: true });
  const got = ['', ''], rsn = ['', ''];
  for await (const ch of s) for (const c of ch.choices) {
    got[c.index] += c.delta.content ?? '';
    rsn[c.index] += c.delta.reasoning_content ?? '';
  }
  for (const k of [0, 1]) check(got[k] === r.choices[k].message.content && rsn[k] === r.choices[k].message.reasoning_content,
                                'n = 2 stream equals the answer', [got, rsn, r.choices]);
  const c = await client.completions.create({ model, prompt: 'Once', max_tokens: 3, temperature: 0, logprobs: 2 });
  const lp = c.choices[0].logprobs;
  check(lp && lp.tokens.length === 3 && lp.token_logprobs.every((x) => x <= 0) && lp.top_logprobs[0][lp.tokens[0]] === lp.token_logprobs[0],
        'completion logprobs: greedy picks the top one', lp);
}
console.log('ok compatibility, n, logprobs');

// concurrent streams: each equal to its solo result (batch invariance end to end)
{
  const reqs = [];
  for (let i = 0; i < 6; i++)
    reqs.push({ model, messages: msgs(`request number ${i} ${'abc'.repeat(i * 7)}`), max_tokens: 30 + 9 * i,
                temperature: i % 2 ? 0 : 0.8, seed: 100 + i, reasoning_effort: i % 3 ? 'high' : 'none' });
  const solo = [];
  for (const p of reqs) solo.push(await chatStream(p));
  for (let round = 0; round < 2; round++) {
    const together = await Promise.all(reqs.map((p) => chatStream(p)));
    for (let i = 0; i < reqs.length; i++)
      check(together[i].content === solo[i].content && together[i].reasoning === solo[i].reasoning && together[i].finish === solo[i].finish,
            `concurrent stream ${i} == solo`, [together[i], solo[i]]);
  }
  const mixed = await Promise.all(reqs.map((p, i) => (i % 2 ? client.chat.completions.create(p) : chatStream(p))));
  for (let i = 0; i < reqs.length; i++) {
    const got = i % 2 ? mixed[i].choices[0].message.content : mixed[i].content;
    check(got === solo[i].content, `concurrent mixed ${i} == solo`, [got, solo[i].content]);
  }
}
console.log('ok concurrent == solo');

// an abandoned stream does not break the next requests
{
  const ac = new AbortController();
  const s = await client.chat.completions.create({ model, messages: msgs('abandon me'), max_tokens: 240, stream: true }, { signal: ac.signal });
  let k = 0;
  try { for await (const ch of s) { if (++k === 3) ac.abort(); } } catch (e) { /* the abort surfaces as an error */ }
  const r = await client.chat.completions.create({ model, messages: msgs('after abort'), max_tokens: 5 });
  checkChat(r, 'after abort', true);
}
console.log('ok abort');
console.log('ALL OK');

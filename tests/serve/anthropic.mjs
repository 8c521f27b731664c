// anthropic.mjs PORT KEY MODEL [tools]: drives `strata serve`'s POST
// /v1/messages with the official @anthropic-ai/sdk (its x-api-key header carries
// the key), streamed and not, and checks the shapes. With "tools": tool use
// only (a full tool loop: two tools declared -> tool_choice any -> tool_use
// blocks -> tool_result blocks -> a final answer, streamed and not; a named
// choice; refusals). Prints "ALL OK" at the end; exits 1 on the first failure.
// Traffic goes to 127.0.0.1 only.
import Ajv from 'ajv';
import Anthropic from '@anthropic-ai/sdk';

const [port, key, model, mode] = process.argv.slice(2);
const client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: key, maxRetries: 0, timeout: 60000 });

function check(cond, what, extra) {
  if (!cond) {
    console.log(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 600) : ''}`);
    process.exit(1);
  }
}
const isNum = (x) => Number.isInteger(x) && x >= 0;
const text = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
const thinking = (m) => m.content.filter((b) => b.type === 'thinking').map((b) => b.thinking).join('');

if (mode === 'tools') {
  await toolUse();
  console.log('ALL OK');
  process.exit(0);
}

// not streamed: system, text blocks, the shape
const params = { model, max_tokens: 8, temperature: 0, system: [{ type: 'text', text: 'Be brief.' }],
                 messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello' }, { type: 'text', text: ' there' }] }] };
const m = await client.messages.create(params);
check(m.type === 'message' && m.role === 'assistant' && m.model === model && typeof m.id === 'string', 'message header', m);
check(Array.isArray(m.content) && m.content.length === 1 && m.content[0].type === 'text', 'one text block', m);
check(['end_turn', 'max_tokens', 'stop_sequence'].includes(m.stop_reason), 'stop_reason', m);
check(isNum(m.usage.input_tokens) && isNum(m.usage.output_tokens) && m.usage.output_tokens <= 8, 'usage', m.usage);
console.log('ok messages');

// streamed: the same text, events in order
const s = client.messages.stream(params);
const seen = [];
s.on('streamEvent', (e) => seen.push(e.type));
const fm = await s.finalMessage();
check(text(fm) === text(m) && fm.stop_reason === m.stop_reason && fm.usage.output_tokens === m.usage.output_tokens,
      'stream equals the answer', [fm, m]);
check(seen[0] === 'message_start' && seen.at(-1) === 'message_stop' && seen.at(-2) === 'message_delta' &&
      seen.includes('content_block_start') && seen.includes('content_block_stop'), 'event order', seen);
console.log('ok stream');

// thinking: a thinking block before the text, streamed as thinking_delta
const tp = { model, max_tokens: 6, temperature: 0, thinking: { type: 'enabled', budget_tokens: 1024 },
             messages: [{ role: 'user', content: 'Why?' }] };
const t1 = await client.messages.create(tp);
check(t1.content[0].type === 'thinking' && typeof t1.content[0].thinking === 'string', 'thinking block', t1);
const ts = client.messages.stream(tp);
let deltas = 0;
ts.on('streamEvent', (e) => { if (e.type === 'content_block_delta' && e.delta.type === 'thinking_delta') deltas++; });
const t2 = await ts.finalMessage();
check(thinking(t2) === thinking(t1) && deltas > 0, 'thinking streamed', [t1, t2, deltas]);
console.log('ok thinking');

// stop sequences: cut and named
{
  const base = await client.messages.create({ ...params, max_tokens: 40 });
  const t = text(base);
  // an ASCII pair (stop strings match the raw bytes; U+FFFD stands for bad ones)
  const mm = /[a-z]{2}/.exec(t.slice(1));
  const cut = mm ? mm[0] : null;
  if (cut) {
    const r = await client.messages.create({ ...params, max_tokens: 40, stop_sequences: [cut] });
    check(text(r) === t.slice(0, t.indexOf(cut)) && r.stop_reason === 'stop_sequence' && r.stop_sequence === cut, 'stop_sequence', [cut, r]);
  }
}
console.log('ok stop sequences');

// errors in Anthropic's shape, as the SDK's typed exceptions
try {
  await client.messages.create({ model, messages: [{ role: 'user', content: 'x' }] });
  check(false, 'missing max_tokens is refused');
} catch (e) {
  check(e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.type === 'error' &&
        e.error?.error?.type === 'invalid_request_error', 'missing max_tokens: 400 in Anthropic shape', e.error);
}
try {
  await new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: key + 'x', maxRetries: 0 }).messages.create(params);
  check(false, 'a wrong key is refused');
} catch (e) {
  check(e instanceof Anthropic.AuthenticationError && e.status === 401, 'wrong key: 401', e.error);
}
console.log('ok errors');
console.log('ALL OK');

// Tool use on a random-weight model: a forced call (tool_choice any / tool) is
// constrained decoding, so its name is declared and its input validates against
// input_schema (ajv); greedy, so streamed == not streamed.
async function toolUse() {
  const tools = [
    { name: 'get_weather', description: 'Current weather of a city',
      input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 6 }, units: { enum: ['C', 'F'] } },
        required: ['city', 'units'], additionalProperties: false } },
    { name: 'get_time', description: 'Local time',
      input_schema: { type: 'object', properties: { tz: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['tz'] } },
  ];
  const names = tools.map((t) => t.name);
  const ajv = new Ajv({ strict: false });
  const valid = Object.fromEntries(tools.map((t) => [t.name, ajv.compile(t.input_schema)]));
  const ask = [{ role: 'user', content: 'What is the weather in Paris, and the time?' }];
  const base = { model, max_tokens: 160, temperature: 0, tools };
  const uses = (m) => m.content.filter((b) => b.type === 'tool_use');
  function checkUses(m, what) {
    check(m.stop_reason === 'tool_use', `${what}: stop_reason`, m);
    const u = uses(m);
    check(u.length >= 1, `${what}: tool_use blocks`, m);
    for (const b of u) {
      check(typeof b.id === 'string' && b.id.startsWith('toolu_') && names.includes(b.name), `${what}: tool_use id/name`, b);
      check(b.input && typeof b.input === 'object' && !Array.isArray(b.input) && valid[b.name](b.input), `${what}: input validates`,
            { b, errors: valid[b.name].errors });
    }
    check(new Set(u.map((b) => b.id)).size === u.length, `${what}: ids distinct`, u);
  }
  // random weights may write NUL, which a text block may not hold: the echo drops it
  const echo = (m) => m.content.map((b) => (b.type === 'text' ? { type: 'text', text: b.text.replaceAll('\u0000', '') } : b));

  let first = null;
  for (const stream of [false, true]) {
    const what = stream ? 'tool loop (streamed)' : 'tool loop';
    const p1 = { ...base, messages: ask, tool_choice: { type: 'any' } };
    let m;
    if (stream) {
      const s = client.messages.stream(p1);
      const ev = [];
      s.on('streamEvent', (e) => ev.push(e));
      m = await s.finalMessage();
      const starts = ev.filter((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
      check(starts.length === uses(m).length && starts.every((e) => JSON.stringify(e.content_block.input) === '{}'),
            `${what}: content_block_start tool_use with input {}`, starts);
      check(ev.some((e) => e.type === 'content_block_delta' && e.delta.type === 'input_json_delta' &&
                     typeof e.delta.partial_json === 'string'), `${what}: input_json_delta`, ev);
      check(JSON.stringify(m.content) === JSON.stringify(first.content) && m.stop_reason === first.stop_reason,
            'streamed == not streamed', [m, first]);
    } else {
      m = await client.messages.create(p1);
      first = m;
    }
    checkUses(m, what);
    // the results, then the answer
    const results = uses(m).map((b, i) => ({ type: 'tool_result', tool_use_id: b.id, content: `result ${i}: 18 C, 14:05`,
      ...(i === 1 ? { is_error: true } : {}) }));
    const history = [...ask, { role: 'assistant', content: echo(m) },
      { role: 'user', content: [...results, { type: 'text', text: 'Thanks. Summarise.' }] }];
    const p2 = { ...base, max_tokens: 24, messages: history, tool_choice: { type: 'none' } };
    const r = stream ? await client.messages.stream(p2).finalMessage() : await client.messages.create(p2);
    check(['end_turn', 'max_tokens'].includes(r.stop_reason) && uses(r).length === 0 && r.content.length === 1 &&
          r.content[0].type === 'text', `${what}: answer`, r);
    // tool results as a list of text blocks, without a trailing user text
    const p3 = { ...p2, messages: [...ask, { role: 'assistant', content: echo(m) },
      { role: 'user', content: uses(m).map((b) => ({ type: 'tool_result', tool_use_id: b.id, content: [{ type: 'text', text: 'ok' }] })) }] };
    const r3 = await client.messages.create(p3);
    check(r3.content[0].type === 'text', `${what}: answer after results only`, r3);
    console.log(`${what}: ok (${uses(m).map((b) => b.name).join(', ')})`);
  }

  // a named tool, one call: that tool
  for (const name of names) {
    const p = { ...base, messages: ask, tool_choice: { type: 'tool', name, disable_parallel_tool_use: true } };
    const m = await client.messages.create(p);
    checkUses(m, `named ${name}`);
    check(uses(m).length === 1 && uses(m)[0].name === name, `named ${name}: one call of it`, m);
    const s = await client.messages.stream(p).finalMessage();
    check(JSON.stringify(s.content) === JSON.stringify(m.content), `named ${name}: streamed == not`, [s, m]);
  }
  console.log('named: ok');

  // refusals in Anthropic's shape
  const refused = async (params, what, re) => {
    try {
      await client.messages.create(params);
      check(false, `${what} is refused`);
    } catch (e) {
      check(e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error' &&
            re.test(e.error?.error?.message), `${what}: 400 in Anthropic shape`, e.error);
    }
  };
  await refused({ model, max_tokens: 8, messages: ask, tool_choice: { type: 'any' } }, 'any without tools', /needs 'tools'/);
  await refused({ ...base, messages: ask, tool_choice: { type: 'tool', name: 'nope' } }, 'an undeclared name', /does not declare/);
  await refused({ ...base, messages: [...ask, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_x', content: 'x' }] }] },
                'a result of no call', /names no tool_use/);
  await refused({ ...base, tools: [{ type: 'bash_20250124', name: 'bash' }], messages: ask }, 'a server tool', /not supported/);
  await refused({ ...base, tools: [{ name: 'f' }], messages: ask }, 'a tool without input_schema', /input_schema/);
  console.log('refusals: ok');
}

// tools.mjs PORT KEY MODEL: tool calls through the official openai client (v4)
// on a random-weight model: a full tool loop (two tools declared ->
// tool_choice "required" -> parsed tool_calls -> tool results -> final answer),
// streamed and not; a named choice; parallel calls in the history; what the
// model writes that is not a call comes back as content; malformed tool
// definitions are 400s. Random weights write garbage, so the checks are on
// shapes and on what a forced call guarantees (a declared name, arguments a
// string), and streamed == not streamed for the same seed. A forced call is
// constrained decoding (docs/serve.md "Tool calls"): its name is declared and
// its arguments validate against the tool's parameters with ajv, alone and 4
// concurrent requests equal to their solo runs. "ALL OK" at the end.
import Ajv from 'ajv';
import OpenAI from 'openai';

const [port, key, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });

function check(cond, what, extra) {
  if (!cond) {
    console.log(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 800) : ''}`);
    process.exit(1);
  }
}

// short strings: random weights rarely end a string, so bounds keep forced calls short
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Current weather of a city', strict: true,
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 6 }, days: { type: 'integer' },
      units: { enum: ['C', 'F', null] } }, required: ['city', 'units'], additionalProperties: false } } },
  { type: 'function', function: { name: 'get_time', description: 'Local time',
    parameters: { type: 'object', properties: { tz: { type: 'string', enum: ['UTC', 'CET'] } } } } },
];
const names = tools.map((t) => t.function.name);
const ajv = new Ajv({ strict: false });
const validators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
const base = { model, max_tokens: 24, seed: 7, temperature: 0.8, reasoning_effort: 'none' };
const forcedMax = 160; // room for a whole constrained call (parallel: several)
const ask = [{ role: 'user', content: 'What is the weather in Paris, and the time?' }];

// forced: the arguments parse and validate against the tool's parameters
function checkCalls(calls, what, forced) {
  check(Array.isArray(calls) && calls.length >= 1, `${what}: tool_calls`, calls);
  calls.forEach((c, i) => {
    check(typeof c.id === 'string' && c.id.startsWith('call_') && c.type === 'function', `${what}: call ${i} id/type`, c);
    check(names.includes(c.function.name) && typeof c.function.arguments === 'string', `${what}: call ${i} name/arguments`, c);
    if (!forced) return;
    let args = null;
    try { args = JSON.parse(c.function.arguments); } catch (e) { check(false, `${what}: call ${i} arguments parse`, c); }
    const v = validators[c.function.name];
    check(v(args), `${what}: call ${i} arguments validate`, { call: c, errors: v.errors });
  });
  check(new Set(calls.map((c) => c.id)).size === calls.length, `${what}: ids distinct`, calls);
}

// Streams a request, assembling tool_calls from their deltas as clients do.
async function streamed(params) {
  const s = await client.chat.completions.create({ ...params, stream: true });
  let content = '', finish = null;
  const calls = [];
  for await (const ch of s) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.content) content += c.delta.content;
    for (const d of c.delta.tool_calls || []) {
      check(Number.isInteger(d.index), 'delta index', d);
      if (!calls[d.index]) {
        // the first delta of a call: index, id, type, function.name
        check(typeof d.id === 'string' && d.type === 'function' && typeof d.function.name === 'string', 'first call delta', d);
        calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: '' } };
      }
      if (d.function && d.function.arguments) calls[d.index].function.arguments += d.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, finish, calls };
}

for (const stream of [false, true]) {
  const what = stream ? 'loop (streamed)' : 'loop';
  // 1. the forced call
  const p1 = { ...base, max_tokens: forcedMax, messages: ask, tools, tool_choice: 'required' };
  let msg, finish;
  if (stream) {
    const r = await streamed(p1);
    msg = { role: 'assistant', content: r.content, tool_calls: r.calls };
    finish = r.finish;
  } else {
    const r = await client.chat.completions.create(p1);
    msg = r.choices[0].message;
    finish = r.choices[0].finish_reason;
    check(msg.content === null || typeof msg.content === 'string', `${what}: content`, msg);
  }
  check(finish === 'tool_calls', `${what}: finish_reason`, finish);
  checkCalls(msg.tool_calls, what, true);
  // 2. results in the history, 3. the answer (random weights may write NUL,
  // which a message may not hold: the echo drops it)
  const noNul = (x) => (typeof x === 'string' ? x.replaceAll('\u0000', '') : x);
  const echoed = msg.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: noNul(c.function.arguments) } }));
  const history = [...ask, { role: 'assistant', content: noNul(msg.content), tool_calls: echoed },
    ...msg.tool_calls.map((c, i) => ({ role: 'tool', tool_call_id: c.id, content: `result ${i}: 18 C, 14:05` }))];
  const p2 = { ...base, messages: history, tools, tool_choice: 'none' };
  if (stream) {
    const r = await streamed(p2);
    check(['stop', 'length'].includes(r.finish) && r.calls.length === 0, `${what}: answer`, r);
  } else {
    const r = await client.chat.completions.create(p2);
    check(typeof r.choices[0].message.content === 'string' && !r.choices[0].message.tool_calls &&
          ['stop', 'length'].includes(r.choices[0].finish_reason), `${what}: answer`, r.choices[0]);
  }
  console.log(`${what}: ok (${msg.tool_calls.length} call(s): ${msg.tool_calls.map((c) => c.function.name).join(', ')})`);
}

// the same request streamed and not gives the same calls, ids included
{
  const p = { ...base, max_tokens: forcedMax, messages: ask, tools, tool_choice: 'required' };
  const a = (await client.chat.completions.create(p)).choices[0].message.tool_calls;
  const b = (await streamed(p)).calls;
  check(JSON.stringify(a) === JSON.stringify(b), 'streamed == not streamed', { a, b });
  const c = (await client.chat.completions.create(p)).choices[0].message.tool_calls;
  check(JSON.stringify(a) === JSON.stringify(c), 'reruns reproduce the ids', { a, c });
  console.log('determinism: ok');
}

// a named choice calls that tool; parallel_tool_calls false: one call
{
  for (const name of names) {
    for (const parallel of [false, true]) {
      const p = { ...base, max_tokens: forcedMax, messages: ask, tools, parallel_tool_calls: parallel,
        tool_choice: { type: 'function', function: { name } } };
      const r = await client.chat.completions.create(p);
      const m = r.choices[0].message;
      check(r.choices[0].finish_reason === 'tool_calls' && m.tool_calls.length === 1 && m.tool_calls[0].function.name === name,
            'named choice', r.choices[0]);
      checkCalls(m.tool_calls, `named ${name}`, true);
      const s = await streamed(p);
      check(JSON.stringify(s.calls) === JSON.stringify(m.tool_calls), `named ${name}: streamed == not`, { s, m });
    }
  }
  // required without parallel calls: exactly one
  const one = await client.chat.completions.create({ ...base, max_tokens: forcedMax, messages: ask, tools, tool_choice: 'required',
    parallel_tool_calls: false, seed: 11 });
  check(one.choices[0].message.tool_calls.length === 1, 'required, parallel off: one call', one.choices[0]);
  checkCalls(one.choices[0].message.tool_calls, 'required, parallel off', true);
  console.log('named: ok');
}

// forced calls over seeds, 4 at once: each equal to its solo run, each valid
{
  const reqs = [1, 2, 3, 4].map((seed) => ({ ...base, max_tokens: forcedMax, seed, messages: ask, tools, tool_choice: 'required' }));
  const solo = [];
  for (const p of reqs) solo.push((await client.chat.completions.create(p)).choices[0]);
  const together = await Promise.all(reqs.map((p) => client.chat.completions.create(p)));
  together.forEach((r, i) => {
    check(JSON.stringify(r.choices[0]) === JSON.stringify(solo[i]), `concurrent ${i} == solo`, { c: r.choices[0], s: solo[i] });
    checkCalls(solo[i].message.tool_calls, `seed ${i + 1}`, true);
  });
  console.log(`concurrent: ok (${solo.map((c) => c.message.tool_calls.length).join(', ')} calls)`);
}

// parallel calls in the history (two calls, two results in order), then an answer
{
  const calls = [
    { id: 'call_a', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","days":2}' } },
    { id: 'call_b', type: 'function', function: { name: 'get_time', arguments: '{"tz":"CET"}' } },
  ];
  const messages = [...ask, { role: 'assistant', content: null, tool_calls: calls },
    { role: 'tool', tool_call_id: 'call_a', content: '18 C' }, { role: 'tool', tool_call_id: 'call_b', content: '14:05' }];
  for (const stream of [false, true]) {
    const p = { ...base, messages, tools, parallel_tool_calls: true };
    const r = stream ? await streamed(p) : (await client.chat.completions.create(p)).choices[0];
    const fin = stream ? r.finish : r.finish_reason;
    check(['stop', 'length', 'tool_calls'].includes(fin), 'parallel history: finish', r);
    if (fin === 'tool_calls') checkCalls(stream ? r.calls : r.message.tool_calls, 'parallel history');
  }
  console.log('parallel: ok');
}

// auto on random weights: garbage comes back as content, never an error
{
  const r = await client.chat.completions.create({ ...base, max_tokens: 48, messages: ask, tools });
  const c = r.choices[0];
  check(typeof c.message.content === 'string' || Array.isArray(c.message.tool_calls), 'auto: content', c);
  if (c.message.tool_calls) checkCalls(c.message.tool_calls, 'auto');
  const s = await streamed({ ...base, max_tokens: 48, messages: ask, tools });
  check(s.content === (c.message.content || '') && s.calls.length === (c.message.tool_calls || []).length, 'auto: streamed == not', { s, c });
  // what clients send by default
  const d = await client.chat.completions.create({ ...base, messages: ask, tools: [], tool_choice: 'none', parallel_tool_calls: true });
  check(typeof d.choices[0].message.content === 'string' && !d.choices[0].message.tool_calls, 'tools [] / none', d.choices[0]);
  console.log('content: ok');
}

// malformed definitions and histories: 400 naming the field
{
  const bad = [
    [{ tools: [{ type: 'function', function: { name: 'has space' } }] }, 'tools.function.name'],
    [{ tools: [{ type: 'code', function: { name: 'x' } }] }, 'tools'],
    [{ tools: [{ type: 'function', function: { name: 'x', parameters: 'nope' } }] }, 'tools.function.parameters'],
    [{ tools: [{ type: 'function', function: { name: 'x', extra: 1 } }] }, 'tools.function'],
    [{ tools: [tools[0], tools[0]] }, 'tools.function.name'],
    [{ tools, tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools, messages: [...ask, { role: 'tool', tool_call_id: 'call_none', content: 'x' }] }, 'messages.tool_call_id'],
    [{ tools, messages: [...ask, { role: 'tool', content: 'x' }] }, 'messages.tool_call_id'],
    [{ tools: [{ type: 'function', function: { name: 'x', strict: true, parameters: { type: 'object', properties: { a: { type: 'string', format: 'x-nope' } } } } }] }, 'tools'],
    [{ tools, messages: [{ role: 'user', content: 'x', tool_calls: [{ id: 'a', type: 'function', function: { name: 'x', arguments: '{}' } }] }] }, 'messages.tool_calls'],
  ];
  for (const [extra, param] of bad) {
    let err = null;
    try { await client.chat.completions.create({ ...base, messages: ask, ...extra }); } catch (e) { err = e; }
    check(err && err.status === 400 && err.param === param, `400 for ${JSON.stringify(extra).slice(0, 120)}`, err && { status: err.status, param: err.param, message: err.message });
  }
  console.log('refusals: ok');
}
console.log('ALL OK');

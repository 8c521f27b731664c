// anthropic.mjs PORT KEY MODEL: drives `strata serve`'s POST /v1/messages with
// the official @anthropic-ai/sdk (its x-api-key header carries the key), streamed
// and not, and checks the shapes. Prints "ALL OK" at the end; exits 1 on the
// first failure. Traffic goes to 127.0.0.1 only.
import Anthropic from '@anthropic-ai/sdk';

const [port, key, model] = process.argv.slice(2);
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

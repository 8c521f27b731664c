// reasoning.mjs PORT KEY MODEL MODE: a chat format's reasoning through the
// official openai client (v4) on a random-weight model whose tokenizer picks
// the format (DeepSeek's tokenizer.json, Kimi's tiktoken). MODE says what the
// format does with the request's reasoning_effort: "always" (R1: its prompt
// opens <think>; K2-Thinking: its model opens it), "never" (DeepSeek-V3, K2) or
// "effort" (V3.1, K2.5, K3). reasoning_content is present exactly when the
// format reasons, and streamed == not streamed (content and reasoning) for the
// same seed, at effort none and high. "ALL OK" at the end.
import OpenAI from 'openai';

const [port, key, model, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });

function check(cond, what, extra) {
  if (!cond) {
    console.log(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 800) : ''}`);
    process.exit(1);
  }
}

async function streamed(params) {
  const s = await client.chat.completions.create({ ...params, stream: true });
  let content = '', reasoning = '', finish = null, sawReasoning = false;
  for await (const ch of s) {
    const c = ch.choices[0];
    if (!c) continue;
    if (typeof c.delta.content === 'string') content += c.delta.content;
    if (typeof c.delta.reasoning_content === 'string') { reasoning += c.delta.reasoning_content; sawReasoning = true; }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, reasoning, finish, sawReasoning };
}

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Why is the sky blue?' }];
for (const effort of ['none', 'high']) {
  const params = { model, messages, max_tokens: 24, seed: 5, temperature: 0.8, reasoning_effort: effort };
  const a = await client.chat.completions.create(params);
  const m = a.choices[0].message;
  const reasons = mode === 'always' || (mode === 'effort' && effort !== 'none');
  check(m.role === 'assistant' && typeof m.content === 'string', `${effort}: message`, m);
  if (reasons) check(typeof m.reasoning_content === 'string', `${effort}: reasoning_content present`, m);
  else check(m.reasoning_content === undefined, `${effort}: no reasoning_content`, m);
  check(['stop', 'length'].includes(a.choices[0].finish_reason), `${effort}: finish_reason`, a.choices[0]);
  const b = await streamed(params);
  check(b.content === m.content, `${effort}: stream content == non-stream`, [b.content, m.content]);
  check(b.reasoning === (m.reasoning_content || ''), `${effort}: stream reasoning == non-stream`, [b.reasoning, m.reasoning_content]);
  check(reasons || !b.sawReasoning, `${effort}: no reasoning deltas`, b);
  check(b.finish === a.choices[0].finish_reason, `${effort}: stream finish`, [b.finish, a.choices[0].finish_reason]);
  // the reply text is the format's: an R1 reply is reasoning until </think>,
  // so 24 random tokens are mostly reasoning
  if (mode === 'always' && model.includes('r1')) check(m.reasoning_content.length > 0, `${effort}: R1 reasons`, m);
}
console.log('ALL OK');

// schema.mjs PORT KEY MODEL: structured output against a running `strata serve`
// on a random-weight model (which writes garbage unconstrained), with the
// official openai client (v4) and ajv as the validator (patterns by ajv's own
// RegExp with the u flag; formats by the checks below, written here from the
// RFCs: ajv-formats is not a dependency). Every json_schema answer
// must finish with "stop", parse and validate; six concurrent requests must equal
// their solo runs bit for bit, greedy and seeded sampling alike; a stream equals
// the plain answer; completions take response_format too; an unsupported keyword
// is a 400 naming it. Prints "ALL OK" at the end; exits 1 on the first failure.
import OpenAI from 'openai';
import Ajv from 'ajv';

const [port, key, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const ajv = new Ajv({ strict: false });
// formats: regexes plus a calendar check (Date, year set explicitly so 0-99 stay themselves)
const isDate = (s) => {
  const m = /^(\d{4})-(\d\d)-(\d\d)$/.exec(s);
  if (!m) return false;
  const d = new Date(0);
  d.setUTCFullYear(+m[1], +m[2] - 1, +m[3]);
  return d.getUTCFullYear() === +m[1] && d.getUTCMonth() === +m[2] - 1 && d.getUTCDate() === +m[3];
};
const TIME = /^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(z|[+-]([01]\d|2[0-3]):[0-5]\d)$/i;
const OCTET = '(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)';
ajv.addFormat('date', isDate);
ajv.addFormat('time', (s) => TIME.test(s));
ajv.addFormat('date-time', (s) => { const p = s.split(/t/i); return p.length === 2 && isDate(p[0]) && TIME.test(p[1]); });
ajv.addFormat('uuid', /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);
ajv.addFormat('email', /^[a-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/i);
ajv.addFormat('ipv4', new RegExp(`^(${OCTET}\\.){3}${OCTET}$`));

function check(cond, what, extra) {
  if (!cond) {
    console.log(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 800) : ''}`);
    process.exit(1);
  }
}

// small enough that a random model finishes them well inside max_tokens
const schemas = {
  person: { type: 'object', properties: { name: { type: 'string', maxLength: 6 }, age: { type: 'integer' } },
            required: ['name', 'age'], additionalProperties: false },
  matrix: { type: 'object', properties: { m: { type: 'array', maxItems: 3,
            items: { type: 'array', items: { type: 'number' }, minItems: 1, maxItems: 3 } } }, required: ['m'] },
  choice: { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] }, ok: { type: 'boolean' },
            note: { type: 'string', maxLength: 4 } }, required: ['color', 'ok'] },
  numbers: { type: 'object', properties: { x: { type: ['number', 'null'] }, y: { type: 'integer' },
             list: { type: 'array', items: { type: 'integer' }, maxItems: 4 } }, required: ['x', 'y', 'list'] },
  nested: { type: 'object', properties: { a: { type: 'object', properties: { b: { const: 'k' },
            c: { type: 'array', items: { anyOf: [{ type: 'integer' }, { type: 'string', maxLength: 3 }] }, maxItems: 2 } },
            required: ['b', 'c'] } }, required: ['a'] },
  // pattern strings: anchored, searched (unanchored), escapes the pattern needs, length bounds
  patterns: { type: 'object', properties: { code: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}$' },
              tag: { type: 'string', pattern: 'ok|yes', maxLength: 8 }, word: { type: 'string', pattern: '^[^\\s"]+$', maxLength: 5 },
              esc: { type: 'string', pattern: '^["\\\\/]{1,3}$' } }, required: ['code', 'tag', 'word', 'esc'] },
  when: { type: 'object', properties: { d: { type: 'string', format: 'date' }, t: { type: 'string', format: 'date-time' },
          tm: { type: 'string', format: 'time' }, n: { type: 'integer', exclusiveMinimum: 0, maximum: 12 },
          y: { type: 'integer', minimum: -40, exclusiveMaximum: 2100 } }, required: ['d', 't', 'tm', 'n', 'y'] },
  where: { type: 'object', properties: { u: { type: 'string', format: 'uuid' }, ip: { type: 'string', format: 'ipv4' },
           e: { type: 'string', format: 'email', maxLength: 20 } }, required: ['u', 'ip', 'e'] },
};

const prompt = (name) => [{ role: 'user', content: `Reply with a JSON document for "${name}".` }];
const fmt = (name) => ({ type: 'json_schema', json_schema: { name, schema: schemas[name], strict: true } });

function validate(name, text, what) {
  let doc;
  try { doc = JSON.parse(text); } catch (e) { check(false, `${what} ${name}: JSON.parse`, text); }
  const ok = ajv.validate(schemas[name], doc);
  check(ok, `${what} ${name}: ajv`, { text, errors: ajv.errors });
}

async function one(name, extra) {
  const r = await client.chat.completions.create({ model, messages: prompt(name), max_tokens: 400, response_format: fmt(name), ...extra });
  const c = r.choices[0];
  check(c.finish_reason === 'stop', `${name}: finish_reason stop`, c);
  check(c.message.reasoning_content === undefined, `${name}: no think channel with response_format`, c.message);
  return c.message.content;
}

for (const [label, extra] of [['greedy', { temperature: 0 }], ['sampled', { temperature: 0.9, seed: 7 }]]) {
  const names = Object.keys(schemas);
  const solo = {};
  for (const n of names) { solo[n] = await one(n, extra); validate(n, solo[n], label); }
  // all at once (the first schema twice): the same bits as alone
  const batch = [...names, names[0]];
  const got = await Promise.all(batch.map((n) => one(n, extra)));
  batch.forEach((n, i) => check(got[i] === solo[n], `${label} ${n}: concurrent equals solo`, { solo: solo[n], got: got[i] }));
  console.log(`ok ${label}: ${names.length} schemas valid, ${batch.length} concurrent equal solo`);
  if (label === 'greedy') {
    // a stream carries the same text
    const s = await client.chat.completions.create({ model, messages: prompt('person'), max_tokens: 400,
                                                     response_format: fmt('person'), temperature: 0, stream: true });
    let text = '', finish = null;
    for await (const ch of s) {
      if (ch.choices.length && typeof ch.choices[0].delta.content === 'string') text += ch.choices[0].delta.content;
      if (ch.choices.length && ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
    check(text === solo.person && finish === 'stop', 'stream equals the plain answer', { text, finish });
    console.log('ok stream');
  }
}

// completions take response_format as well
{
  const r = await client.completions.create({ model, prompt: 'JSON:', max_tokens: 400, temperature: 0,
                                              response_format: fmt('choice') });
  check(r.choices[0].finish_reason === 'stop', 'completion finish_reason', r.choices[0]);
  validate('choice', r.choices[0].text, 'completion');
  console.log('ok completions');
}

// json_object: an object when it ends ("length" leaves a prefix); text is accepted as before
{
  const r = await client.chat.completions.create({ model, messages: prompt('object'), max_tokens: 60, temperature: 0,
                                                   response_format: { type: 'json_object' } });
  const c = r.choices[0];
  check(['stop', 'length'].includes(c.finish_reason) && c.message.content.trimStart().startsWith('{'), 'json_object', c);
  if (c.finish_reason === 'stop') check(typeof JSON.parse(c.message.content) === 'object', 'json_object parses', c);
  const t = await client.chat.completions.create({ model, messages: prompt('x'), max_tokens: 4, response_format: { type: 'text' } });
  check(t.choices[0].message.content !== undefined, 'response_format text');
  console.log('ok json_object, text');
}

// refused schemas: 400 naming the keyword
for (const [schema, want] of [[{ type: 'string', pattern: '^a(?=b)' }, "'pattern' '^a(?=b)': lookahead"],
                               [{ type: 'object', properties: { d: { type: 'string', format: 'hostname' } } }, "unsupported format 'hostname'"],
                               [{ $ref: '#' }, '$ref']]) {
  let err = null;
  try {
    await client.chat.completions.create({ model, messages: prompt('x'), max_tokens: 4,
                                           response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
  } catch (e) { err = e; }
  check(err && err.status === 400 && err.message.includes(want) && err.param === 'response_format', `refused ${want}`,
        err && { status: err.status, message: err.message, param: err.param });
}
console.log('ok refused schemas');
console.log('ALL OK');

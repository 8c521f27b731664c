// page.mjs PORT KEY MODEL: the chat page of a running `strata serve` in a real
// headless browser (Debian's chromium driven by puppeteer-core). Loads GET /,
// sends a message, watches the reply grow chunk by chunk, checks the folded
// thinking and the speed line, then starts a long reply and stops it with the
// Stop button (the server frees the sequence: the next message is answered);
// then a wrong key and a prompt over the context: each failed turn is taken
// back (its text in the input box, the error shown, the header never shows an
// error as the model's name) and the next message is answered.
// Prints "SKIP: reason" and exits 0 when no browser can be started here (the
// binary is missing or cannot run in this sandbox); one line per check group
// and "ALL OK" otherwise; exits 1 on the first failure.
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [port, key, model] = process.argv.slice(2);
const exe = process.env.STRATA_CHROMIUM || '/usr/bin/chromium';
const base = `http://127.0.0.1:${port}`;

function check(cond, what, extra) {
  if (!cond) {
    console.log(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 600) : ''}`);
    process.exit(1);
  }
}

if (!existsSync(exe)) { console.log(`SKIP: no browser at ${exe} (bash scripts/install-deps.sh installs Debian's chromium)`); process.exit(0); }
let puppeteer;
try { puppeteer = (await import('puppeteer-core')).default; } catch (e) {
  console.log(`SKIP: puppeteer-core is not installed (npm ci --prefix tests/serve): ${e.message}`);
  process.exit(0);
}

const profile = mkdtempSync(join(tmpdir(), 'strata-chromium-'));
let browser;
try {
  // --no-sandbox: root in a container has no user namespaces for chromium's own
  // sandbox; the background-networking flags keep it off the (closed) network
  browser = await puppeteer.launch({
    executablePath: exe, headless: true, timeout: 30000, userDataDir: profile,
    args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-extensions'],
  });
} catch (e) {
  console.log(`SKIP: chromium does not start in this sandbox: ${String(e.message).split('\n')[0]}`);
  rmSync(profile, { recursive: true, force: true });
  process.exit(0);
}

async function metric(name) {
  const t = await (await fetch(`${base}/metrics`)).text();
  const line = t.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.slice(name.length + 1)) : NaN;
}

let failed = true;
try {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.evaluateOnNewDocument((k) => localStorage.setItem('strata_key', k), key);
  const r = await page.goto(`${base}/`, { waitUntil: 'load', timeout: 20000 });
  check(r.status() === 200, 'GET / in the browser', r.status());
  await page.waitForFunction((m) => document.getElementById('model').textContent === m, { timeout: 10000 }, model);
  console.log('ok page loads, lists the model');

  // every change of the reply's text is recorded by the page itself
  const send = async (text) => {
    await page.evaluate(() => {
      window.__growth = [];
      window.__obs = new MutationObserver(() => {
        const boxes = document.querySelectorAll('.msg.assistant');
        const b = boxes[boxes.length - 1];
        if (b) window.__growth.push(b.querySelector('.reply').textContent.length + b.querySelector('.think div').textContent.length);
      });
      window.__obs.observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
    });
    await page.click('#in');
    await page.keyboard.type(text);
    await page.click('#send');
  };

  // a short reply: it grows in several steps, ends, and gets its speed line
  await page.$eval('#maxtok', (e) => { e.value = '24'; });
  await page.$eval('#temp', (e) => { e.value = '0'; });
  await send('Hello there, how are you?');
  await page.waitForFunction(() => !document.getElementById('send').disabled && document.querySelector('.msg.assistant .stats').textContent,
                             { timeout: 20000 });
  const g = await page.evaluate(() => window.__growth);
  const distinct = [...new Set(g)].filter((x) => x > 0);
  check(distinct.length >= 3 && distinct.every((x, i) => i === 0 || x > distinct[i - 1]), 'the reply streams in (grows chunk by chunk)', g);
  const shown = await page.evaluate(() => {
    const b = document.querySelector('.msg.assistant');
    const d = b.querySelector('details.think');
    return { think: d.querySelector('div').textContent, open: d.open, hidden: d.hidden, reply: b.querySelector('.reply').textContent,
             stats: b.querySelector('.stats').textContent, user: document.querySelector('.msg.user').textContent };
  });
  check(shown.user === 'Hello there, how are you?', 'the user message is shown', shown);
  check(shown.think.length + shown.reply.length > 0, 'the reply has text', shown);
  check(!shown.open, 'thinking is folded', shown);
  check(/^[0-9]+ tokens, [0-9.]+ tok\/s, first token [0-9]+ ms; prompt [0-9]+ tokens \([0-9]+ cached\)$/.test(shown.stats), 'speed line', shown.stats);
  console.log('ok a message streams a reply (folded thinking, speed line)');

  // a long reply (max tokens empty: the rest of the context), stopped: the page
  // stops, the server frees the sequence
  await page.$eval('#maxtok', (e) => { e.value = ''; });
  await send('Now tell me a very long story.');
  await page.waitForFunction(() => { const g = window.__growth; return g.length >= 3 && g[g.length - 1] > 0; }, { timeout: 20000 });
  check(!(await page.$eval('#stop', (e) => e.disabled)), 'Stop is enabled while streaming');
  await page.click('#stop');
  await page.waitForFunction(() => !document.getElementById('send').disabled, { timeout: 5000 });
  const after = await page.evaluate(() => { const b = [...document.querySelectorAll('.msg.assistant')].pop(); return b.querySelector('.stats').textContent; });
  check(after === 'stopped', 'the stopped reply says so', after);
  let active = NaN;
  for (let i = 0; i < 50 && active !== 0; i++) { active = await metric('strata_active_sequences'); if (active) await new Promise((r) => setTimeout(r, 100)); }
  check(active === 0, 'the server freed the sequence after Stop', active);
  const len1 = await page.evaluate(() => window.__growth[window.__growth.length - 1]);
  await new Promise((r) => setTimeout(r, 300));
  const len2 = await page.evaluate(() => window.__growth[window.__growth.length - 1]);
  check(len1 === len2, 'nothing more arrives after Stop', [len1, len2]);
  console.log('ok Stop ends the reply and frees the sequence');

  // the conversation goes on
  await page.$eval('#maxtok', (e) => { e.value = '8'; });
  await send('Thanks.');
  await page.waitForFunction(() => !document.getElementById('send').disabled && [...document.querySelectorAll('.msg.assistant')].length === 3 &&
                             [...document.querySelectorAll('.msg.assistant')].pop().querySelector('.stats').textContent.includes('tokens'),
                             { timeout: 20000 });
  console.log('ok the conversation goes on');

  // issue 38: a failed turn leaves no trace. A wrong key: the header names no
  // model (not the 401's text), the turn fails, its text is back in the box
  const count = () => page.evaluate(() => ({ user: document.querySelectorAll('.msg.user').length,
    assistant: document.querySelectorAll('.msg.assistant').length, err: document.querySelectorAll('.msg.err').length,
    input: document.getElementById('in').value, model: document.getElementById('model').textContent,
    lastErr: [...document.querySelectorAll('.msg.err')].map((e) => e.textContent).pop() || '' }));
  const setKey = (k) => page.$eval('#key', (e, v) => { e.value = v; e.dispatchEvent(new Event('change')); }, k);
  await page.click('#clear'); // a new chat: the context is the test's own
  const before = await count();
  await setKey('wrong-key');
  await page.waitForFunction(() => document.getElementById('model').textContent === '', { timeout: 10000 });
  await page.$eval('#in', (e) => { e.value = 'This will fail.'; });
  await page.click('#send');
  await page.waitForFunction((n) => document.querySelectorAll('.msg.err').length === n + 1 && !document.getElementById('send').disabled,
                             { timeout: 10000 }, before.err);
  let now = await count();
  check(now.user === before.user && now.assistant === before.assistant && now.input === 'This will fail.' && /API key/.test(now.lastErr) &&
        now.model === '', 'a 401 turn is taken back (text in the box, error shown, no model name)', now);
  await setKey(key);
  await page.waitForFunction((m) => document.getElementById('model').textContent === m, { timeout: 10000 }, model);
  // a prompt over the context: refused, and the next message still goes through
  await page.$eval('#in', (e) => { e.value = 'many words '.repeat(600); });
  await page.click('#send');
  await page.waitForFunction((n) => document.querySelectorAll('.msg.err').length === n + 2 && !document.getElementById('send').disabled,
                             { timeout: 10000 }, before.err);
  now = await count();
  check(now.user === before.user && now.assistant === before.assistant && now.input.startsWith('many words') &&
        /context/.test(now.lastErr), 'a turn over the context is taken back', now);
  await page.$eval('#in', (e) => { e.value = ''; });
  await page.$eval('#maxtok', (e) => { e.value = '4'; });
  await send('Short again.');
  await page.waitForFunction((n, e) => !document.getElementById('send').disabled &&
                             ((document.querySelectorAll('.msg.assistant').length === n + 1 &&
                               [...document.querySelectorAll('.msg.assistant')].pop().querySelector('.stats').textContent.includes('tokens')) ||
                              document.querySelectorAll('.msg.err').length > e + 2),
                             { timeout: 20000 }, before.assistant, before.err);
  now = await count();
  check(now.err === before.err + 2 && now.user === before.user + 1 && now.assistant === before.assistant + 1, 'the next message is answered', now);
  check(errors.length === 0, 'no script errors on the page', errors);
  console.log('ok failed turns are taken back; the header names the model only from /v1/models');
  failed = false;
} finally {
  await browser.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}
console.log(failed ? 'FAILED' : 'ALL OK');
process.exit(failed ? 1 : 0);

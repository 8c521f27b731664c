// bench.mjs NAME FILE [REPS]: encode throughput of js-tiktoken (pure JS) and
// tiktoken (the Rust core as WASM) for encoding NAME (cl100k_base, o200k_base) on
// FILE, best of REPS passes (default 3) after a warm-up. Same output shape as
// bench_tok.c and, like it, timed in CPU time because the machine is shared.
// process.cpuUsage also counts V8's GC helper threads, so the oracles may be
// charged a little more than their main thread used; encoding itself is
// single-threaded in both packages.
import fs from "node:fs";
import { createRequire } from "node:module";

const [name, file, repsArg] = process.argv.slice(2);
const reps = Number(repsArg ?? 3);
const require = createRequire(new URL("../../tests/tok/package.json", import.meta.url));
const text = fs.readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text);
const short = name.replace("_base", "");

function bench(label, encode) {
  encode(text.slice(0, 100000)); // warm-up: JIT, lazy tables
  let best = Infinity, n = 0;
  for (let r = 0; r < reps; r++) {
    const c0 = process.cpuUsage();
    n = encode(text).length;
    const c = process.cpuUsage(c0);
    const dt = (c.user + c.system) / 1e6;
    best = Math.min(best, dt);
  }
  console.log(`${label.padEnd(11)} ${short.padEnd(7)} ${(bytes / best / 1e6).toFixed(2).padStart(8)} MB/s  (${n} ids, best of ${reps})`);
}

const { Tiktoken } = await import(require.resolve("js-tiktoken/lite"));
const ranks = (await import(require.resolve(`js-tiktoken/ranks/${name}`))).default;
const js = new Tiktoken(ranks);
bench("js-tiktoken", (s) => js.encode(s, [], []));
const { get_encoding } = require("tiktoken");
const wasm = get_encoding(name);
bench("tiktoken", (s) => wasm.encode_ordinary(s));
wasm.free();

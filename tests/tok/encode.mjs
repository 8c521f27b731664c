// encode.mjs IMPL NAME IN OUT [IN OUT ...]: encodes each file IN with IMPL (js =
// js-tiktoken, wasm = tiktoken, the Rust core compiled to WASM) and encoding NAME
// (cl100k_base, o200k_base); writes "id,id,...\n" to OUT ("-" = stdout).
// IMPL kimi-wasm: tokenization_kimi.py's encode: its 400k/25k-character chunking,
// then tiktoken's Rust core with Kimi's pat_str exactly as released (the regex
// crate has [..&&[^..]] natively) over the vocab file NAME (any ranks). An IN
// ending in .jsonl holds one JSON string per line: each is encoded on its own,
// one id line each. Special-token text is encoded as ordinary text, as
// `strata tokenize` does without --special. Several files per run share the
// vocabulary load (1-2 s for o200k).
import fs from "node:fs";

const [impl, name, ...files] = process.argv.slice(2);
if (!files.length || files.length % 2) { console.error("usage: encode.mjs js|wasm NAME IN OUT [IN OUT ...]"); process.exit(2); }
let encode, done = () => {};
if (impl === "js") {
  const { Tiktoken } = await import("js-tiktoken/lite");
  const ranks = (await import(`js-tiktoken/ranks/${name}`)).default;
  const enc = new Tiktoken(ranks);
  encode = (s) => enc.encode(s, [], []);
} else if (impl === "wasm") {
  const { get_encoding } = await import("tiktoken");
  const enc = get_encoding(name);
  encode = (s) => enc.encode_ordinary(s);
  done = () => enc.free();
} else if (impl === "kimi-wasm") {
  const { Tiktoken } = await import("tiktoken");
  const pat = [
    String.raw`[\p{Han}]+`,
    String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
    String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
    String.raw`\p{N}{1,3}`,
    String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
    String.raw`\s*[\r\n]+`,
    String.raw`\s+(?!\S)`,
    String.raw`\s+`,
  ].join("|");
  const enc = new Tiktoken(fs.readFileSync(name, "utf8"), {}, pat);
  // tokenization_kimi.py's encode: 400,000-character chunks, each cut where a run
  // of whitespace / non-whitespace (Python str.isspace) passes 25,000 characters.
  const pyspace = (ch) => {
    const c = ch.codePointAt(0);
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c === 0x85 || c === 0xa0 || c === 0x1680 ||
      (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000;
  };
  function* chunks(s) {
    const cps = Array.from(s);
    for (let i = 0; i < cps.length; i += 400000) {
      const c = cps.slice(i, i + 400000);
      let run = 0, isSp = c.length ? pyspace(c[0]) : false, start = 0;
      for (let k = 0; k < c.length; k++) {
        const now = pyspace(c[k]);
        if (isSp !== now) { run = 1; isSp = now; }
        else if (++run > 25000) { yield c.slice(start, k).join(""); start = k; run = 1; }
      }
      yield c.slice(start).join("");
    }
  }
  encode = (s) => { const ids = []; for (const c of chunks(s)) for (const id of enc.encode_ordinary(c)) ids.push(id); return ids; };
  done = () => enc.free();
} else {
  console.error("usage: encode.mjs js|wasm|kimi-wasm NAME IN OUT [IN OUT ...]"); process.exit(2);
}
for (let i = 0; i < files.length; i += 2) {
  const [inPath, outPath] = [files[i], files[i + 1]];
  const text = fs.readFileSync(inPath, "utf8");
  let out;
  if (inPath.endsWith(".jsonl"))
    out = text.split("\n").filter((l) => l.length).map((l) => encode(JSON.parse(l)).join(",") + "\n").join("");
  else
    out = encode(text).join(",") + "\n";
  if (outPath === "-") process.stdout.write(out); else fs.writeFileSync(outPath, out);
}
done();

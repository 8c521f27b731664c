// encode.mjs IMPL NAME IN OUT [IN OUT ...]: encodes each file IN with IMPL (js =
// js-tiktoken, wasm = tiktoken, the Rust core compiled to WASM) and encoding NAME
// (cl100k_base, o200k_base); writes "id,id,...\n" to OUT ("-" = stdout).
// IMPL kimi-wasm: tiktoken's Rust core with Kimi's pat_str exactly as released
// (the regex crate has [..&&[^..]] natively) over the vocab file NAME: the
// reference semantics of the Kimi split, with any ranks. An IN
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
  encode = (s) => enc.encode_ordinary(s);
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

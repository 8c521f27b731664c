// encode.mjs IMPL NAME IN [OUT]: encodes file IN (UTF-8 text) with IMPL (js =
// js-tiktoken, wasm = tiktoken) and encoding NAME; writes "id,id,...\n" to OUT
// (or stdout). Special-token text is encoded as ordinary text, as
// `strata tokenize` does without --special.
import fs from "node:fs";

const [impl, name, inPath, outPath] = process.argv.slice(2);
const text = fs.readFileSync(inPath, "utf8");
let ids;
if (impl === "js") {
  const { Tiktoken } = await import("js-tiktoken/lite");
  const ranks = (await import(`js-tiktoken/ranks/${name}`)).default;
  ids = new Tiktoken(ranks).encode(text, [], []);
} else if (impl === "wasm") {
  const { get_encoding } = await import("tiktoken");
  const enc = get_encoding(name);
  ids = Array.from(enc.encode_ordinary(text));
  enc.free();
} else {
  console.error("usage: encode.mjs js|wasm NAME IN [OUT]"); process.exit(2);
}
const s = ids.join(",") + "\n";
if (outPath) fs.writeFileSync(outPath, s); else process.stdout.write(s);

// encode_hf.mjs TOKENIZER_JSON TOKENIZER_CONFIG IN OUT [IN OUT ...]: encodes each
// file IN with @huggingface/tokenizers (pure JS, a second implementation of
// Hugging Face tokenizers) and writes "id,id,...\n" to OUT. An IN ending in
// .jsonl holds one JSON string per line, each encoded on its own (one id line
// each). add_special_tokens is false (strata's tok_encode adds no BOS) except
// for IN files ending in .bos.jsonl, which show the post-processor's BOS.
// Added tokens (special or not) are matched in the text, as tokenizers does.
import fs from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tjson, tcfg, ...files] = process.argv.slice(2);
if (!files.length || files.length % 2) { console.error("usage: encode_hf.mjs TOKENIZER_JSON TOKENIZER_CONFIG IN OUT [IN OUT ...]"); process.exit(2); }
const tok = new Tokenizer(JSON.parse(fs.readFileSync(tjson, "utf8")), JSON.parse(fs.readFileSync(tcfg, "utf8")));
for (let i = 0; i < files.length; i += 2) {
  const [inp, out] = [files[i], files[i + 1]];
  const add = inp.endsWith(".bos.jsonl");
  const texts = inp.endsWith(".jsonl")
    ? fs.readFileSync(inp, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l))
    : [fs.readFileSync(inp, "utf8")];
  const lines = texts.map((s) => tok.encode(s, { add_special_tokens: add }).ids.join(","));
  fs.writeFileSync(out, lines.join("\n") + "\n");
}

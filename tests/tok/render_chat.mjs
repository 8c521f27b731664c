// render_chat.mjs TOKENIZER_CONFIG CASES OUT: renders each case of CASES (a JSON
// array of {messages, add_generation_prompt, thinking?}) with the chat_template
// of TOKENIZER_CONFIG through @huggingface/jinja (the Jinja engine transformers.js
// uses), bos_token from the config; writes one JSON string per line to OUT.
import fs from "node:fs";
import { Template } from "@huggingface/jinja";

const [cfgPath, casesPath, out] = process.argv.slice(2);
if (!out) { console.error("usage: render_chat.mjs TOKENIZER_CONFIG CASES OUT"); process.exit(2); }
const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
const bos = typeof cfg.bos_token === "string" ? cfg.bos_token : cfg.bos_token.content;
const tmpl = new Template(cfg.chat_template);
const lines = JSON.parse(fs.readFileSync(casesPath, "utf8")).map((c) => {
  const vars = { messages: c.messages, bos_token: bos, add_generation_prompt: c.add_generation_prompt };
  if (c.thinking !== undefined) vars.thinking = c.thinking;
  return JSON.stringify(tmpl.render(vars));
});
fs.writeFileSync(out, lines.join("\n") + "\n");

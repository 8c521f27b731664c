// export_vocab.mjs NAME OUT: writes js-tiktoken's NAME ranks (cl100k_base,
// o200k_base) as a tiktoken.model file: "base64(token) rank\n", by rank.
import fs from "node:fs";

const [name, out] = process.argv.slice(2);
if (!name || !out) { console.error("usage: export_vocab.mjs NAME OUT"); process.exit(2); }
const ranks = (await import(`js-tiktoken/ranks/${name}`)).default;
// bpe_ranks lines: "<tag> <first rank> <tok> <tok> ..." (consecutive ranks).
const byRank = [];
for (const line of ranks.bpe_ranks.split("\n")) {
  if (!line) continue;
  const [, off, ...toks] = line.split(" ");
  toks.forEach((t, i) => { byRank[Number(off) + i] = t; });
}
const lines = [];
for (let r = 0; r < byRank.length; r++) {
  if (byRank[r] === undefined) { console.error(`rank ${r} missing in ${name}`); process.exit(1); }
  lines.push(`${byRank[r]} ${r}\n`);
}
fs.writeFileSync(out, lines.join(""));

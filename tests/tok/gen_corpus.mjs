// gen_corpus.mjs OUT_DIR [SEED] [BYTES]: writes the tokenizer test corpus, the
// same bytes for the same seed on any machine (own PRNG, no Math.random):
//   corpus.txt  >= BYTES (default 1.2 MB) of mixed text, valid UTF-8
//   cases.jsonl one JSON string per line: edge cases encoded one by one
//   chunky.txt  ~400k characters aimed at the seams of Kimi's encode chunking
//
// Excluded on purpose, because the oracles disagree among themselves there
// (documented in tok.c / t_tok.c): U+0085 and U+FEFF (JS \s differs from
// tiktoken's White_Space), "'" followed by U+017F (JS spells (?i:'s) as an ASCII
// list), and code points assigned after Unicode 14 (PCRE2 10.42's tables).
import fs from "node:fs";
import path from "node:path";

const [outDir, seedArg, bytesArg] = process.argv.slice(2);
if (!outDir) { console.error("usage: gen_corpus.mjs OUT_DIR [SEED] [BYTES]"); process.exit(2); }
let seed = (Number(seedArg ?? 20261202) >>> 0) || 1;
const target = Number(bytesArg ?? 1200000);

// xorshift32: tiny, deterministic, good enough to shuffle snippets.
function rnd() { seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0; return seed / 4294967296; }
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];

const words = {
  latin: ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "internationalization", "naïve", "café",
    "résumé", "Straße", "façade", "jalapeño", "smörgåsbord", "Ærøskøbing", "œuvre", "Łódź", "Dvořák", "İstanbul",
    "tokenizer", "McDonald", "iPhone", "XMLHttpRequest", "camelCase", "snake_case", "SCREAMING", "Hello", "WORLD"],
  cyrillic: ["Привет", "мир", "съешь", "же", "ещё", "этих", "мягких", "французских", "булок", "ПРОГРАММИРОВАНИЕ",
    "Україна", "їжак", "Ґанок", "Беларусь", "ўсход", "Српски", "Ђорђе"],
  greek: ["Γειά", "σου", "κόσμε", "ΑΛΦΑΒΗΤΟ", "ξεσκεπάζω", "ψυχοφθόρα", "βδελυγμία", "Ωμέγα", "ίδιο"],
  arabic: ["مرحبا", "بالعالم", "العربية", "لغة", "جميلة", "الذكاء", "الاصطناعي", "مُحَمَّد", "٣٤٥", "كتاب"],
  hebrew: ["שלום", "עולם", "עִבְרִית", "מחשב", "תוכנה", "ירושלים"],
  devanagari: ["नमस्ते", "दुनिया", "हिन्दी", "भाषा", "संस्कृतम्", "क्षत्रिय", "१२३", "प्रोग्रामिंग"],
  thai: ["สวัสดี", "ชาวโลก", "ภาษาไทย", "คอมพิวเตอร์", "กรุงเทพมหานคร", "๑๒๓"],
  cjk: ["中文", "汉字", "漢字", "人工智能", "机器学习", "東京", "日本語", "我们", "的", "是", "模型", "混合", "々", "〇"],
  kana: ["ひらがな", "カタカナ", "こんにちは", "トークナイザー", "ありがとう", "ー", "・", "ヴ"],
  hangul: ["안녕하세요", "세계", "한국어", "토크나이저", "사랑해", "ㄱㄴㄷ"],
  misc: ["Ⅻ", "½", "²", "①", "℃", "™", "©", "§", "¶", "…", "—", "–", "«", "»", "„", "“", "”", "‘", "’", "€", "£",
    "¥", "₹", "∑", "∞", "≠", "≤", "√", "∫", "→", "⇒", "─", "│", "┌", "█", "░", "\u00ad", "\u200b", "\u200c",
    "\u2060", "\u00a0", "\u2003", "\u202f", "\u3000", "\u1680", "\u205f", "\u2028", "\u2029", "\u180e"],
  emoji: ["😀", "🎉", "👍", "👍🏽", "👋🏿", "🧑🏻‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "🇯🇵", "1️⃣", "#️⃣", "🤷‍♀️",
    "👩🏾‍🚀", "🐈‍⬛", "🫠", "©️", "✌️", "🙋‍♂️"],
};
const scripts = Object.keys(words);
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'vE",
  "'M", "'LL", "'Ll", "'lL", "'D", "’s", "'x", "''", "'"];
const code = [
  "int main(int argc, char **argv) {\n    return argc > 1 ? 0 : 1;\n}\n",
  "def f(x):\n\tif x is None:\n\t\treturn []\n\treturn [y ** 2 for y in x if y % 2 == 0]\n",
  "for (size_t i = 0; i < n; i++) { s += a[i] * b[i]; }  // dot\n",
  "const re = /^[a-z0-9_-]{3,16}$/gi; let x = `${a}+${b}`;\r\n",
  "SELECT id, name FROM users WHERE age >= 18 AND email LIKE '%@example.com';\n",
  "<div class=\"row\"><span id='x'>&nbsp;&lt;tag&gt;</span></div>\n",
  "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))\n",
  "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", v); Ok(()) }\n",
  "    if (err) {\n        goto fail;\n    }\n\n\n",
  "$ ls -la /usr/local/bin | grep -E '^-rwx' && echo \"done\" >&2\n",
  "x = a//b; y = a/b/c; path = \"/usr/lib/x86_64-linux-gnu/\"; url = https://example.com/a/b?c=d&e=f#g\n",
  "<|endoftext|> <|open|> [BOS] <|im_start|>user\n",
];

function number() {
  const k = ri(6);
  if (k === 0) return String(ri(10));
  if (k === 1) return String(ri(1e9));
  if (k === 2) return Array.from({ length: 1 + ri(40) }, () => ri(10)).join("");
  if (k === 3) return `${ri(1000)},${String(ri(1000)).padStart(3, "0")}.${ri(100)}`;
  if (k === 4) return `${ri(2100)}-${String(1 + ri(12)).padStart(2, "0")}-${String(1 + ri(28)).padStart(2, "0")}`;
  return `0x${ri(1 << 30).toString(16)}`;
}

function whitespace() {
  const k = ri(10);
  if (k < 5) return " ";
  if (k === 5) return "\n";
  if (k === 6) return "\r\n";
  if (k === 7) return " ".repeat(1 + ri(64));
  if (k === 8) return Array.from({ length: 1 + ri(12) }, () => pick([" ", "\t", "\n", "\r\n", "\r", "\u000b", "\f", "\u00a0", "\u3000"])).join("");
  return "\n\n" + " ".repeat(ri(8));
}

function caseVariant(w) {
  const k = ri(6);
  if (k === 0) return w.toUpperCase();
  if (k === 1) return w.toLowerCase();
  if (k === 2) return w[0].toUpperCase() + w.slice(1);
  return w;
}

// One random code point from blocks stable since long before Unicode 14.
const blocks = [[0x21, 0x7e], [0xa1, 0xff], [0x100, 0x17e], [0x180, 0x24f], [0x300, 0x36f], [0x391, 0x3c9], [0x400, 0x4ff],
  [0x5b0, 0x5c7], [0x5d0, 0x5ea], [0x621, 0x64a], [0x660, 0x669], [0x900, 0x97f], [0xe01, 0xe5b], [0x1e00, 0x1eff],
  [0x2010, 0x2027], [0x2030, 0x205e], [0x2070, 0x209c], [0x20a0, 0x20bf], [0x2100, 0x218b], [0x2190, 0x23ff],
  [0x2460, 0x24ff], [0x2500, 0x27bf], [0x3001, 0x303f], [0x3041, 0x3096], [0x30a1, 0x30ff], [0x3131, 0x318e],
  [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0xff01, 0xff5e], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x10000, 0x1000b]];
function randomChar() {
  for (;;) {
    const [a, b] = pick(blocks);
    const c = a + ri(b - a + 1);
    if (c === 0x17f) continue;
    const s = String.fromCodePoint(c);
    if (/\p{Cn}/u.test(s)) continue; // unassigned: skip
    return s;
  }
}

function chunk() {
  const k = ri(100);
  if (k < 45) { // a sentence in one script
    const sc = pick(scripts), n = 1 + ri(12);
    let s = "";
    for (let i = 0; i < n; i++) {
      s += caseVariant(pick(words[sc]));
      if (ri(8) === 0) s += pick(contractions);
      s += ri(10) === 0 ? pick([",", ".", "!", "?", ";", ":", "、", "。", "，", "؟", "।"]) : "";
      s += i + 1 < n ? (sc === "cjk" && ri(2) ? "" : whitespace()) : "";
    }
    return s;
  }
  if (k < 60) { // mixed scripts without spaces
    let s = "";
    for (let i = 0, n = 2 + ri(6); i < n; i++) s += pick(words[pick(scripts)]);
    return s;
  }
  if (k < 68) return pick(code);
  if (k < 74) return number();
  if (k < 80) { // JSON
    const o = { id: ri(1e6), name: pick(words.latin), tags: [pick(words.cjk), pick(words.emoji)],
      score: rnd() * 100, ok: ri(2) === 1, nested: { path: "/a/b", "key with spaces": null } };
    return JSON.stringify(o, null, ri(2) ? 2 : undefined);
  }
  if (k < 86) return Array.from({ length: 1 + ri(20) }, randomChar).join("");
  if (k < 90) return whitespace() + whitespace();
  if (k < 94) return pick(words.emoji) + pick(words.emoji) + " " + pick(words.emoji);
  if (k < 97) return "I" + pick(contractions) + " " + pick(["don't", "WON'T", "They'RE", "we'Ve", "it'S", "y'all'd've"]);
  return "-".repeat(1 + ri(80)) + pick(["", "\n", "=".repeat(ri(40))]);
}

const parts = [];
let size = 0;
while (size < target) {
  const c = chunk() + (ri(3) ? " " : whitespace());
  parts.push(c);
  size += Buffer.byteLength(c);
}
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "corpus.txt"), parts.join(""));

// Edge cases, each encoded on its own.
const cases = ["", " ", "  ", "\n", "\r\n", "\r", "\t", "a", "A", "0", "!", "'", "'s", "'S", "don't", "DON'T", "x'LL",
  "     x", "x     ", " \n ", "\n\n\n", " \r\n\r\n  ", "1234567", "١٢٣٤", "中文English混合", "中文", "𠀀𠀁", "ﾊﾝｶｸ",
  "👨‍👩‍👧‍👦", "👍🏽👍🏿", "🇫🇷🇩🇪", "1️⃣2️⃣", "e\u0301\u0301\u0301", "\u0301", "a\u200db", " ".repeat(1000),
  "\n".repeat(300), "a".repeat(500), "ab".repeat(400), "9".repeat(301), "<|endoftext|>", "<|open|>message<|sep|>",
  "/".repeat(50) + "\n", "x//y//\n\n", "\u00a0\u00a0x", "\u3000中\u3000", "hello\u2028world", "A\u180eB"];
for (let c = 0x20; c < 0x7f; c++) cases.push(String.fromCharCode(c));
for (let i = 0; i < 300; i++) cases.push(chunk());
fs.writeFileSync(path.join(outDir, "cases.jsonl"), cases.map((c) => JSON.stringify(c)).join("\n") + "\n");

// chunky.txt: exercises the Kimi encode's chunking (tok.c encode_kimi_chunked):
// a 30,000-character non-whitespace run (cut at 25,000, inside a piece) and a word
// straddling character 400,000 (the chunk seam).
{
  const out = ["ab,".repeat(10000) + " "];
  let chars = 30001; // code points so far (all words below are BMP: length == code points)
  while (chars < 399990) { const w = pick(["hello ", "world ", "中文 ", "Привет ", "x\n"]); out.push(w); chars += w.length; }
  out.push("internationalization of everything");
  const s = out.join("");
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, "chunky.txt"), s);
}

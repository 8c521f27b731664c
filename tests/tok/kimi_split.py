"""kimi_split.py: the oracle for strata's Kimi pre-tokenizer (run with /usr/bin/python3,
which has the `regex` module; Python's `re` lacks \\p{..} and class intersection).

  kimi_split.py split FILE      FILE (.txt: one document; .jsonl: one JSON string per
                                line) -> for each document a line of the UTF-8 byte
                                lengths of its pieces, comma-separated
  kimi_split.py classes         for each character class of the pattern, a line
                                "NAME lo-hi,lo-hi,..." of the code points it matches

The pattern is tokenization_kimi.py's pat_str, written as released (V1 set syntax
for [..&&[^\\p{Han}]]).
"""
import json
import sys

import regex

PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

# The classes the C translation spells differently; names match t_tok.c.
CLASSES = [
    ("han", r"[\p{Han}]"),
    ("upper_nohan", r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"),
    ("lower_nohan", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"),
    ("space", r"\s"),
    ("not_space_letter_number", r"[^\s\p{L}\p{N}]"),
    ("not_crlf_letter_number", r"[^\r\n\p{L}\p{N}]"),
    ("number", r"\p{N}"),
]


def split(path):
    data = open(path, "rb").read().decode("utf-8")
    docs = [json.loads(l) for l in data.split("\n") if l] if path.endswith(".jsonl") else [data]
    rx = regex.compile(PAT, regex.V1)
    out = []
    for d in docs:
        out.append(",".join(str(len(m.group(0).encode("utf-8"))) for m in rx.finditer(d)))
    sys.stdout.write("\n".join(out) + "\n")


def classes():
    # One string of every scalar value (no surrogates); finditer yields the runs.
    allcp = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    for name, cls in CLASSES:
        rx = regex.compile(cls + "+", regex.V1)
        ranges = []
        for m in rx.finditer(allcp):
            lo, hi = ord(m.group(0)[0]), ord(m.group(0)[-1])
            if ranges and ranges[-1][1] + 1 == lo:
                ranges[-1][1] = hi
            elif ranges and ranges[-1][1] == 0xD7FF and lo == 0xE000:
                ranges[-1][1] = hi
            else:
                ranges.append([lo, hi])
        print(name, ",".join("%x-%x" % (a, b) for a, b in ranges))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "split":
        split(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "classes":
        classes()
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)

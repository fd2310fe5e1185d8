"""Writes the inference benchmark's texts: real English prose of 10-600
characters, deterministic, with no download.

The source is the reference documentation CPython ships with every install
(pydoc_data.topics): paragraphs of it, whitespace folded, keeping those that
are mostly words, in a fixed shuffled order.

usage: python texts.py OUT.jsonl [N]   (N defaults to 3000)
"""

import json
import random
import sys

import pydoc_data.topics as topics


def paragraphs():
    for name in sorted(topics.topics):
        for p in topics.topics[name].split("\n\n"):
            p = " ".join(p.split())
            letters = sum(c.isalpha() or c == " " for c in p)
            if 10 <= len(p) <= 600 and letters >= 0.8 * len(p):
                yield p


def main():
    out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    texts = list(dict.fromkeys(paragraphs()))
    # Sentences of the longer paragraphs fill up to n when paragraphs run short.
    for p in list(texts):
        for s in p.split(". "):
            s = s.strip()
            if 10 <= len(s) <= 600 and s not in texts:
                texts.append(s)
    random.Random(7).shuffle(texts)
    if len(texts) < n:
        sys.exit(f"texts.py: only {len(texts)} texts available, {n} asked")
    with open(out, "w", encoding="utf-8") as f:
        for t in texts[:n]:
            f.write(json.dumps({"text": t}) + "\n")
    lens = sorted(len(t) for t in texts[:n])
    print(f"texts.py: {n} texts, {lens[0]}-{lens[-1]} characters, median {lens[n // 2]}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Writes the demo corpus: N distinct English sentences as JSON Lines.

    python3 deploy/make_corpus.py 12000 > corpus.jsonl

Deterministic: the same N gives the same file. Each line is
{"id": "s00042", "text": "..."}; topics repeat so that nearest neighbours
are meaningful.
"""

import json
import sys

SUBJECTS = ["The engineer", "A student", "My neighbour", "The old fisherman", "A small robot",
            "The chef", "Our team", "The pilot", "A curious cat", "The librarian",
            "The gardener", "A young musician", "The doctor", "A tired traveller", "The farmer"]
VERBS = ["repairs", "paints", "studies", "sells", "photographs", "cooks", "describes",
         "carries", "builds", "cleans", "watches", "reads about", "writes about", "finds", "loses"]
OBJECTS = ["a wooden boat", "the bicycle", "a bowl of soup", "the mountain trail", "a broken laptop",
           "the river bank", "an old map", "the garden fence", "a loaf of bread", "the night sky",
           "a jazz record", "the train station", "a stack of invoices", "the city park", "a red kite"]
ENDINGS = ["before sunrise.", "in the rain.", "after lunch.", "with great care.", "for the first time.",
           "while humming a song.", "on a quiet Sunday.", "without telling anyone.", "as the storm arrives.",
           "next to the harbour.", "late at night.", "in a hurry.", "with two friends.",
           "during the holidays.", "at the market."]


def sentences(n):
    count = 0
    for e in range(len(ENDINGS)):
        for o in range(len(OBJECTS)):
            for v in range(len(VERBS)):
                for s in range(len(SUBJECTS)):
                    # Walk the combinations in a scrambled but fixed order.
                    i = (s * 7 + v * 11 + o * 13 + e * 17) % len(SUBJECTS)
                    yield f"{SUBJECTS[i]} {VERBS[v]} {OBJECTS[o]} {ENDINGS[e]}"
                    count += 1
                    if count >= n:
                        return


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 12000
    seen = set()
    out = sys.stdout
    k = 0
    for text in sentences(n * 2):
        if text in seen:
            continue
        seen.add(text)
        out.write(json.dumps({"id": f"s{k:05d}", "text": text}) + "\n")
        k += 1
        if k >= n:
            break
    if k < n:
        sys.exit(f"only {k} distinct sentences")


if __name__ == "__main__":
    main()

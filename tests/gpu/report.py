"""The inputs and the figures of tests/gpu/run.sh (plain Python; the
sentence-transformers reference needs torch and sentence-transformers).

  report.py corpus N FIXTURE OUT          N texts: the fixture's sentences, then the demo corpus
  report.py prompts N GREEDY OUT          N chat prompts: the greedy fixture's, then made ones
  report.py st MODEL TEXTS DEVICE OUT     sentence-transformers' best texts/s in fp32 and fp16;
                                          writes OUT.fp32 and OUT.fp16 (f32 rows)
  report.py embed NAME VECS FIXTURE [ST]  agreement of the fleet's vectors (.npy) with the
                                          fixture's and, when given, sentence-transformers'
  report.py answers ANSWERS CPU [--write] generated tokens; how many equal the CPU path's
  report.py same A B                      how many answers of A equal B's (by id)

Each prints one line of the report; a check that fails exits 1.
"""

import json
import os
import sys
import time


def corpus(n, fixture, out):
    fixed = json.load(open(fixture, encoding="utf-8"))["sentences"]
    # make_corpus.py: in the repository's deploy/, or beside this file in a bundle.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(here, "..", "..", "deploy")]
    from make_corpus import sentences

    with open(out, "w", encoding="utf-8") as f:
        texts = list(fixed[:n])
        texts += [s for s in sentences(n - len(texts))]
        for i, t in enumerate(texts[:n]):
            f.write(json.dumps({"id": f"t{i}", "text": t}) + "\n")


TOPICS = ["the moon", "coffee", "volcanoes", "jazz", "honeybees", "winter", "bread", "the ocean",
          "binary search", "lighthouses", "friendship", "electricity", "maps", "tea", "snow"]
ASKS = ["Explain {} to a child.", "Give two facts about {}.", "Write a short poem about {}.",
        "What is the history of {}?"]


def prompts(n, greedy, out):
    cases = json.load(open(greedy, encoding="utf-8"))
    chats = [c["messages"] for c in cases]
    i = 0
    while len(chats) < n:
        chats.append([{"role": "user",
                       "content": ASKS[i % len(ASKS)].format(TOPICS[i % len(TOPICS)])}])
        i += 1
    with open(out, "w", encoding="utf-8") as f:
        for k, m in enumerate(chats[:n]):
            f.write(json.dumps({"id": f"p{k}", "messages": m}) + "\n")


def st(model_dir, texts_path, device, out):
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    texts = [json.loads(line)["text"] for line in open(texts_path, encoding="utf-8")]
    # f32 whatever the checkpoint's dtype (the bundle's weights are stored
    # in f16, and transformers would otherwise keep them so).
    try:
        model = SentenceTransformer(model_dir, device=device,
                                    model_kwargs={"dtype": torch.float32})
    except TypeError:
        model = SentenceTransformer(model_dir, device=device,
                                    model_kwargs={"torch_dtype": torch.float32})
    model = model.float()
    batches = (64, 128, 256, 512, 1024) if device != "cpu" else (64,)
    for dtype in ("fp32", "fp16"):
        if dtype == "fp16":
            if device == "cpu":
                print(f"sentence-transformers fp16: not on the CPU")
                break
            model = model.half()
        best = None
        for batch in batches:
            model.encode(texts[: batch * 2], batch_size=batch)  # warm-up
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            vecs = model.encode(texts, batch_size=batch, convert_to_numpy=True)
            secs = time.perf_counter() - t
            rate = len(texts) / secs
            if best is None or rate > best[0]:
                best = (rate, batch, vecs)
        rate, batch, vecs = best
        np.asarray(vecs, dtype="<f4").tofile(f"{out}.{dtype}")
        print(f"sentence-transformers {dtype}: {rate:.0f} texts/s (best batch {batch}; "
              f"torch {torch.__version__}, {device})")


def load_npy(path):
    """Rows of a little-endian f32 .npy file (as `minions collect` writes), without numpy."""
    import ast
    from array import array

    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise SystemExit(f"{path}: not a .npy file")
        major = f.read(2)[0]
        size = int.from_bytes(f.read(2 if major == 1 else 4), "little")
        header = ast.literal_eval(f.read(size).decode("latin1"))
        if header["descr"] != "<f4" or header["fortran_order"]:
            raise SystemExit(f"{path}: not little-endian f32 rows")
        rows, dim = header["shape"]
        flat = array("f")
        flat.frombytes(f.read())
    return [flat[i * dim:(i + 1) * dim] for i in range(rows)]


def load_f32(path, dim):
    from array import array

    flat = array("f")
    flat.frombytes(open(path, "rb").read())
    return [flat[i * dim:(i + 1) * dim] for i in range(len(flat) // dim)]


def rows_agree(a, b):
    """Max abs diff, least and mean row cosine of two lists of rows."""
    if len(a) != len(b):
        raise SystemExit(f"{len(a)} rows against {len(b)}")
    diff, cosines = 0.0, []
    for x, y in zip(a, b):
        dot = xx = yy = 0.0
        for p, q in zip(x, y):
            dot += p * q
            xx += p * p
            yy += q * q
            diff = max(diff, abs(p - q))
        cosines.append(dot / ((xx * yy) ** 0.5 or 1.0))
    return diff, min(cosines), sum(cosines) / len(cosines)


def embed(name, vecs_path, fixture, st_path=None):
    vecs = load_npy(vecs_path)
    want = json.load(open(fixture, encoding="utf-8"))["embeddings"]
    diff, least, _ = rows_agree(vecs[: len(want)], want)
    line = (f"{name}: {len(vecs)} texts; against the committed sentence-transformers vectors "
            f"({len(want)} texts): max abs diff {diff:.1e}, least cosine {least:.6f}")
    ok = least >= 0.999
    if st_path:
        diff, least, mean = rows_agree(vecs, load_f32(st_path, len(vecs[0])))
        line += (f"; against sentence-transformers here: max abs diff {diff:.1e}, "
                 f"cosine least {least:.6f} mean {mean:.6f}")
        ok = ok and least >= 0.999
    print(line)
    if not ok:
        print(f"{name}: FAILED: a cosine under 0.999")
        sys.exit(1)


def answers(path, cpu_path, write=False):
    got = [json.loads(line) for line in open(path, encoding="utf-8")]
    tokens = sum(int(g.get("completion_tokens", 0)) for g in got)
    errors = [g["id"] for g in got if g.get("finish_reason") == "error"]
    if write:
        with open(cpu_path, "w", encoding="utf-8") as f:
            for g in got:
                f.write(json.dumps({"id": g["id"], "text": g["text"]}) + "\n")
        print(f"wrote {len(got)} answers to {cpu_path}")
    want = {}
    if os.path.exists(cpu_path):
        for line in open(cpu_path, encoding="utf-8"):
            w = json.loads(line)
            want[w["id"]] = w["text"]
    same = sum(1 for g in got if want.get(g["id"]) == g["text"])
    print(json.dumps({"answers": len(got), "tokens": tokens, "errors": len(errors),
                      "equal_to_cpu": same}))
    if errors:
        sys.exit(1)


def same(a, b):
    def texts(path):
        return {g["id"]: g["text"] for g in map(json.loads, open(path, encoding="utf-8"))}

    ta, tb = texts(a), texts(b)
    print(sum(1 for k, v in ta.items() if tb.get(k) == v))


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "corpus":
        corpus(int(args[0]), args[1], args[2])
    elif cmd == "prompts":
        prompts(int(args[0]), args[1], args[2])
    elif cmd == "st":
        st(*args)
    elif cmd == "embed":
        embed(*args)
    elif cmd == "same":
        same(args[0], args[1])
    elif cmd == "answers":
        answers(args[0], args[1], write="--write" in args[2:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

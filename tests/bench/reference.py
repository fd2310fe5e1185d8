"""Runs sentence-transformers (PyTorch) over the benchmark texts: prints one
JSON line with its throughput and writes the vectors (little-endian f32,
row-major, input order) for comparison with Minions' own.

usage: python reference.py MODEL_DIR TEXTS.jsonl VECTORS_OUT [--threads N]
       [--batch B] [--device cpu|mps|cuda]
"""

import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("texts")
    ap.add_argument("vectors_out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(a.threads)
    with open(a.texts, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    model = SentenceTransformer(a.model_dir, device=a.device)
    model.encode(texts[: a.batch], batch_size=a.batch)  # warm-up
    t = time.perf_counter()
    vecs = model.encode(texts, batch_size=a.batch, convert_to_numpy=True)
    secs = time.perf_counter() - t
    np.asarray(vecs, dtype="<f4").tofile(a.vectors_out)
    print(json.dumps({
        "name": f"sentence-transformers {__import__('sentence_transformers').__version__}, "
                f"torch {torch.__version__} ({a.device}, {a.threads} threads)",
        "texts": len(texts),
        "dim": int(vecs.shape[1]),
        "seconds": secs,
        "texts_per_s": len(texts) / secs,
    }))


if __name__ == "__main__":
    sys.exit(main())

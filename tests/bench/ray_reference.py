"""Ray Data over the benchmark texts: N actors, each running
sentence-transformers on one CPU, end to end. Prints one JSON line with the
throughput.

The clock starts after ray.init (a running cluster, as a Minions fleet is
running before a job) and covers building the dataset, starting the actors,
loading the model in each, embedding every text and gathering the vectors
in the driver.

usage: python ray_reference.py MODEL_DIR TEXTS.jsonl [--actors N] [--batch B]
"""

import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("texts")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()

    import ray

    with open(a.texts, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    ray.init(num_cpus=a.actors, include_dashboard=False, log_to_driver=False)
    model_dir = a.model_dir

    class Embed:
        def __init__(self):
            import torch
            from sentence_transformers import SentenceTransformer

            torch.set_num_threads(1)
            self.model = SentenceTransformer(model_dir, device="cpu")

        def __call__(self, batch):
            batch["embedding"] = self.model.encode(
                list(batch["text"]), batch_size=len(batch["text"]), convert_to_numpy=True
            )
            return batch

    t = time.perf_counter()
    ds = ray.data.from_items([{"i": i, "text": s} for i, s in enumerate(texts)])
    rows = ds.map_batches(
        Embed,
        compute=ray.data.ActorPoolStrategy(size=a.actors),
        batch_size=a.batch,
        num_cpus=1,
    ).take_all()
    secs = time.perf_counter() - t
    if len(rows) != len(texts) or len({r["i"] for r in rows}) != len(texts):
        sys.exit(f"ray_reference.py: {len(rows)} rows back for {len(texts)} texts")
    import sentence_transformers
    import torch

    print(json.dumps({
        "name": f"Ray Data {ray.__version__}, {a.actors} actors of sentence-transformers "
                f"{sentence_transformers.__version__}, torch {torch.__version__} (1 thread each)",
        "texts": len(texts),
        "seconds": secs,
        "texts_per_s": len(texts) / secs,
    }))
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())

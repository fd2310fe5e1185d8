"""Runs ONNX Runtime (CPU provider) over the benchmark texts, as a service
that deploys it would: prints one JSON line with its throughput and writes
the vectors (little-endian f32, row-major, input order) for comparison with
Minions' own.

The model folder is exported once with optimum (`optimum-cli export onnx
--task feature-extraction`, the graph a user deploys) into EXPORT_DIR; int8
is that graph through onnxruntime's `quantize_dynamic` (per-channel, MatMul
only). Texts are tokenized with the model folder's own tokenizer.json,
truncated to sentence-transformers' max_seq_length, sorted by length and cut
into the same passes Minions runs (at most --batch-texts texts and
--batch-tokens tokens, padding included); the output is mean pooled over the
attention mask and L2-normalised when the folder's modules.json says so.

usage: python onnx_reference.py MODEL_DIR EXPORT_DIR TEXTS.jsonl VECTORS_OUT
       [--precision f32|int8] [--threads N] [--batch-texts B]
       [--batch-tokens T]
"""

import argparse
import json
import os
import subprocess
import sys
import time


def export(model_dir, export_dir, precision, fused):
    """The ONNX file for `precision`, made on first use: optimum's graph, or
    with `fused` that graph through onnxruntime's transformer optimizer
    (attention, GELU and skip-LayerNorm fused, as `optimum-cli export onnx
    --optimize O2` does)."""
    plain = os.path.join(export_dir, "model.onnx")
    if not os.path.exists(plain):
        os.makedirs(export_dir, exist_ok=True)
        subprocess.run(
            ["optimum-cli", "export", "onnx", "--model", model_dir,
             "--task", "feature-extraction", export_dir],
            check=True, stdout=sys.stderr,
            env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep
                 + os.environ.get("PATH", "")},
        )
    f32 = plain
    if fused:
        f32 = os.path.join(export_dir, "model_fused.onnx")
        if not os.path.exists(f32):
            from onnxruntime.transformers.optimizer import optimize_model

            with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            m = optimize_model(plain, model_type="bert", num_heads=cfg["num_attention_heads"],
                               hidden_size=cfg["hidden_size"], opt_level=1)
            tmp = f32 + ".tmp"
            m.save_model_to_file(tmp)
            os.replace(tmp, f32)
    if precision == "f32":
        return f32
    # The quantizer reads standard ops only, so int8 starts from optimum's
    # graph; the session's own optimizer fuses what it can after.
    q = os.path.join(export_dir, "model_int8.onnx")
    if not os.path.exists(q):
        from onnxruntime.quantization import QuantType, quantize_dynamic

        tmp = q + ".tmp"
        quantize_dynamic(plain, tmp, per_channel=True, op_types_to_quantize=["MatMul"],
                         weight_type=QuantType.QInt8)
        os.replace(tmp, q)
    return q


def passes(lens, max_texts, max_tokens):
    """Length-sorted passes of at most max_texts texts and max_tokens tokens
    (padding included), as Minions cuts them."""
    order = sorted(range(len(lens)), key=lambda i: lens[i])
    out, cur = [], []
    for i in order:
        width = max([lens[j] for j in cur] + [lens[i]])
        if cur and (len(cur) + 1 > max_texts or (len(cur) + 1) * width > max_tokens):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("export_dir")
    ap.add_argument("texts")
    ap.add_argument("vectors_out")
    ap.add_argument("--precision", default="f32", choices=["f32", "int8"])
    ap.add_argument("--graph", default="fused", choices=["plain", "fused"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-texts", type=int, default=128)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    a = ap.parse_args()

    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    path = export(a.model_dir, a.export_dir, a.precision, a.graph == "fused")
    with open(os.path.join(a.model_dir, "sentence_bert_config.json"), encoding="utf-8") as f:
        max_len = int(json.load(f).get("max_seq_length", 512))
    normalise = False
    modules = os.path.join(a.model_dir, "modules.json")
    if os.path.exists(modules):
        with open(modules, encoding="utf-8") as f:
            normalise = any(m.get("type", "").endswith("Normalize") for m in json.load(f))
    with open(a.texts, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}

    tok = Tokenizer.from_file(os.path.join(a.model_dir, "tokenizer.json"))
    tok.enable_truncation(max_len)
    tok.no_padding()

    def run(batch_texts):
        """Tokenize, pad to the pass's longest, run, pool: the vectors."""
        enc = tok.encode_batch(batch_texts)
        width = max(len(e.ids) for e in enc)
        ids = np.zeros((len(enc), width), dtype=np.int64)
        mask = np.zeros((len(enc), width), dtype=np.int64)
        for r, e in enumerate(enc):
            ids[r, : len(e.ids)] = e.ids
            mask[r, : len(e.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in names:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden = sess.run(None, feed)[0]
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        if normalise:
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled

    run(texts[:64])  # warm-up
    t = time.perf_counter()
    # Lengths come from the same tokenizer; counting them is part of the run.
    lens = [len(e.ids) for e in tok.encode_batch(texts)]
    vecs = None
    for p in passes(lens, a.batch_texts, a.batch_tokens):
        out = run([texts[i] for i in p])
        if vecs is None:
            vecs = np.zeros((len(texts), out.shape[1]), dtype=np.float32)
        vecs[p] = out
    secs = time.perf_counter() - t
    np.asarray(vecs, dtype="<f4").tofile(a.vectors_out)
    print(json.dumps({
        "name": f"ONNX Runtime {ort.__version__} ({a.precision}, "
                f"{a.graph if a.precision == 'f32' else 'optimum'} graph, "
                f"passes of {a.batch_texts}, CPU, {a.threads} threads)",
        "texts": len(texts),
        "dim": int(vecs.shape[1]),
        "tokens": int(sum(lens)),
        "seconds": secs,
        "texts_per_s": len(texts) / secs,
    }))


if __name__ == "__main__":
    sys.exit(main())

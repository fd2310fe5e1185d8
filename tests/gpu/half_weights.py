"""Writes a safetensors file with every F32 tensor stored as F16 (plain Python).

  python half_weights.py IN.safetensors OUT.safetensors

Halves an embedding model for tests/gpu/pack.sh's bundle. Loaders that ask
for f32 (Minions' worker, sentence-transformers) widen the weights back, so
both sides of the GPU check read the same rounded numbers.
"""

import json
import struct
import sys

MAX_HEADER = 100 * 1024 * 1024


def main(src, dst):
    with open(src, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        if size > MAX_HEADER:
            raise SystemExit(f"{src}: header of {size} bytes")
        header = json.loads(f.read(size))
        data = f.read()
    meta = header.pop("__metadata__", None)
    out_header, chunks, at = {}, [], 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        start, end = t["data_offsets"]
        raw = data[start:end]
        dtype = t["dtype"]
        if dtype == "F32":
            n = len(raw) // 4
            raw = struct.pack(f"<{n}e", *struct.unpack(f"<{n}f", raw))
            dtype = "F16"
        out_header[name] = {"dtype": dtype, "shape": t["shape"],
                            "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    if meta is not None:
        out_header["__metadata__"] = meta
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])

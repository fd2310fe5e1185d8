"""A producer written from schemas/WIRE.md alone (wire_producer.py: nats-py
and msgpack, no Minions code) submits an embedding job to a real fleet; its
vectors, read back from the store by the same file, equal bit for bit those
of the same texts submitted with `minions submit` and collected with
`minions collect`."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import wire_producer  # noqa: E402

TEXTS = 500
SHARD_SIZE = 64
OUTPUT_TIMEOUT_S = 180


def make_texts(n: int) -> list[str]:
    """Short sentences, the same on every run."""
    subjects = ["The cat", "A river", "My neighbour", "The old clock", "A red kite", "Our team"]
    verbs = ["watches", "follows", "ignores", "paints", "remembers", "carries"]
    objects = ["the harbour", "a quiet song", "three lanterns", "the last train", "cold tea"]
    places = ["at dawn", "in the rain", "after lunch", "near the bridge", "on Sundays", "again"]
    return [
        f"{subjects[i % 6]} {verbs[(i // 6) % 6]} {objects[(i // 36) % 5]} "
        f"{places[(i // 180) % 6]} (note {i})."
        for i in range(n)
    ]


def wait_for_outputs(store_url: str, job: str, shards: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        missing = wire_producer.missing_outputs(store_url, job, shards)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job}: {len(missing)} of {shards} shard outputs still missing after "
                f"{timeout:.0f} s (first: {missing[:5]}); the fleet did not run the shards "
                "the wire producer published"
            )
        time.sleep(0.25)


def test_wire_producer_matches_cli(fleet, tmp_path, capsys):
    texts = make_texts(TEXTS)
    t0 = time.monotonic()

    # Submitted by the producer written from WIRE.md, read back by it.
    sub = asyncio.run(
        wire_producer.submit_embedding_job(
            fleet.nats_url, fleet.store_url, fleet.model, texts, shard_size=SHARD_SIZE
        )
    )
    assert sub.shards == (TEXTS + SHARD_SIZE - 1) // SHARD_SIZE
    assert sub.published == sub.shards and sub.duplicates == 0
    wait_for_outputs(fleet.store_url, sub.job, sub.shards, OUTPUT_TIMEOUT_S)
    wire = wire_producer.read_embeddings(fleet.store_url, sub.job)
    t_wire = time.monotonic() - t0
    assert wire.shape == (TEXTS, 384) and wire.dtype == np.float32

    # The CLI follows the job it did not submit: the spec and events decode.
    st = fleet.wait_done(sub.job, timeout=60)
    assert st["records"] == TEXTS and st["shards"] == sub.shards

    # §6.2 step 4: the same id and input again publishes nothing (every
    # shard has its output); another input under that id is refused.
    again = asyncio.run(
        wire_producer.submit_embedding_job(
            fleet.nats_url, fleet.store_url, fleet.model, texts, shard_size=SHARD_SIZE, job=sub.job
        )
    )
    assert (again.shards, again.published) == (sub.shards, 0)
    with pytest.raises(ValueError, match="different input"):
        asyncio.run(
            wire_producer.submit_embedding_job(
                fleet.nats_url, fleet.store_url, fleet.model, texts[:-1],
                shard_size=SHARD_SIZE, job=sub.job,
            )
        )

    # The same texts through the CLI.
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    t1 = time.monotonic()
    job = fleet.cli(
        "submit", "--model", fleet.model, "--input", str(jsonl), "--shard-size", str(SHARD_SIZE)
    ).strip()
    fleet.wait_done(job, timeout=OUTPUT_TIMEOUT_S)
    cli = fleet.collect(job, tmp_path / "cli.npy")
    t_cli = time.monotonic() - t1

    # The CLI's collect of the wire producer's job reads the same bytes.
    assert np.array_equal(fleet.collect(sub.job, tmp_path / "wire.npy"), wire)

    assert cli.shape == wire.shape
    diff = float(np.max(np.abs(cli - wire)))
    with capsys.disabled():
        print(
            f"\nwire producer: {sub.shards} shards of {SHARD_SIZE}, {TEXTS} texts in {t_wire:.1f} s; "
            f"CLI: {t_cli:.1f} s; max abs diff {diff}"
        )
    # Same shards, same batches, same model and worker build: bit for bit.
    assert diff == 0.0, f"max abs diff {diff} between the wire producer's and the CLI's vectors"

"""The Python client (python/, `import minions`) against a real local fleet:
nats-server, a watchdog and two workers running all-MiniLM-L6-v2 (the
`fleet` fixture in conftest.py).

Vectors from the client must equal the command line's for the same inputs
bit for bit: the client runs the CLI's own submit and collect code, and the
workers cut the same shards into the same batches."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import minions

N = 5000
WORDS = "fleet shard worker vector model office laptop queue store embed batch idle night desk owner".split()


def texts(n: int, seed: int = 7) -> list[str]:
    """Short made-up sentences, the same every run."""
    rng = random.Random(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for i in range(n)]


@pytest.fixture(scope="module")
def client(fleet):
    return minions.connect(nats=fleet.nats_url, store=fleet.store_url)


@pytest.fixture(scope="module")
def cli_vectors(fleet, tmp_path_factory):
    """The N texts submitted and collected through the command line."""
    d = tmp_path_factory.mktemp("cli")
    path = d / "texts.jsonl"
    with open(path, "w") as f:
        for t in texts(N):
            f.write(json.dumps({"text": t}) + "\n")
    job = fleet.cli("submit", "--model", fleet.model, "--input", str(path)).strip()
    fleet.wait_done(job, timeout=600)
    return fleet.collect(job, d / "cli.npy")


def test_a_series_and_a_parquet_file_give_the_cli_vectors(client, fleet, cli_vectors, tmp_path):
    series = pd.Series(texts(N), name="body")

    ticks: list[float] = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    t0 = time.monotonic()
    job = client.submit(fleet.model, series)
    t1 = time.monotonic()
    stop.set()
    ticker.join()
    inside = [t for t in ticks if t0 + 0.002 < t < t1 - 0.002]
    print(f"submit of a {N}-text Series took {t1 - t0:.3f} s; another Python thread ran {len(inside)} times meanwhile")
    # The submit reads, uploads and publishes with the GIL released: a
    # Python thread keeps running meanwhile (with the GIL held it could not).
    assert len(inside) >= 2, "the GIL was held during submit"
    assert job.report["records"] == N and job.report["shards"] == (N + 255) // 256

    # A Parquet file with the same texts, ids in a shuffled integer column,
    # several row groups.
    doc_ids = list(range(N))
    random.Random(3).shuffle(doc_ids)
    table = pa.table({"doc_id": pa.array(doc_ids, pa.int64()), "body": pa.array(texts(N)), "other": pa.array([1.5] * N)})
    path = tmp_path / "docs.parquet"
    pq.write_table(table, path, row_group_size=1200)
    pjob = client.submit(fleet.model, str(path), text_field="body", id_field="doc_id")
    assert pjob.report["records"] == N

    st = job.wait(progress=True, timeout=600)
    assert st["state"] == "done" and st["records_done"] == N
    pjob.wait(timeout=600)

    v = job.collect()
    assert v.dtype == np.float32 and v.shape == cli_vectors.shape == (N, 384)
    diff = float(np.abs(v - cli_vectors).max())
    pv = pjob.collect()
    pdiff = float(np.abs(pv - cli_vectors).max())
    print(f"Series job {job.id}: max abs diff to the CLI's vectors {diff}; Parquet job {pjob.id}: {pdiff}")
    assert diff == 0.0 and pdiff == 0.0

    t = pjob.collect(format="arrow")
    assert t.column_names == ["row", "id", "vector"]
    assert t.schema.field("vector").type == pa.list_(pa.float32(), 384)
    assert t.column("id").to_pylist() == [str(i) for i in doc_ids], "ids not in input order"
    assert t.column("row").to_pylist() == list(range(N))
    arrow_vectors = np.asarray(t.column("vector").combine_chunks().flatten()).reshape(N, 384)
    assert np.array_equal(arrow_vectors, cli_vectors)

    # The CLI's Parquet output of the same job reads back in pyarrow.
    out = tmp_path / "out.parquet"
    fleet.cli("collect", pjob.id, "--output", str(out))
    back = pq.read_table(out)
    assert back.schema.field("row").type == pa.uint64()
    assert back.schema.field("id").type == pa.string()
    assert back.schema.field("vector").type in (pa.list_(pa.float32(), 384), pa.list_(pa.field("item", pa.float32(), False), 384))
    assert back.column("id").to_pylist() == [str(i) for i in doc_ids]
    assert np.array_equal(np.asarray(back.column("vector").combine_chunks().flatten()).reshape(N, 384), cli_vectors)

    # Status, workers and the same job's .npy file through the client.
    assert client.job(job.id).status()["state"] == "done"
    assert len(client.workers()) >= 2
    report = job.collect(output=tmp_path / "v.npy")
    assert report["rows"] == N and report["dim"] == 384
    assert np.array_equal(np.load(tmp_path / "v.npy"), cli_vectors)


def test_bad_input_is_a_clear_error_and_publishes_nothing(client, fleet, tmp_path):
    # No such column: the error names it and lists the file's columns.
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": ["a", "b"], "n": [1, 2]}), path)
    with pytest.raises(minions.MinionsError, match=r"text.*body") as e:
        client.submit(fleet.model, str(path), text_field="text", job="py-bad-column")
    assert "nothing was published" in str(e.value)
    # A column of the wrong type names the column and its type.
    with pytest.raises(minions.MinionsError, match=r"\bn\b.*Int64|Int64.*\bn\b"):
        client.submit(fleet.model, str(path), text_field="n", job="py-bad-type")
    # A corrupt file names the file.
    bad = tmp_path / "corrupt.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(minions.MinionsError, match="corrupt.parquet"):
        client.submit(fleet.model, str(bad), job="py-corrupt")
    for job in ("py-bad-column", "py-bad-type", "py-corrupt"):
        assert not (fleet.store_dir / "jobs" / job).exists(), f"{job} left something in the store"

    with pytest.raises(TypeError, match="record 1 is null"):
        client.submit(fleet.model, ["a", None])
    with pytest.raises(ValueError, match="1 ids for 2 records"):
        client.submit(fleet.model, ["a", "b"], ids=["x"])
    with pytest.raises(ValueError, match="shard-size"):
        client.submit(fleet.model, ["a"], shard_size=0)
    with pytest.raises(minions.MinionsError, match='unknown model "nope"'):
        client.submit("nope", ["a"])
    with pytest.raises(minions.MinionsError, match="unknown job"):
        client.job("job-that-is-not").status()


def test_an_error_is_its_message_unless_debug_asks(fleet, monkeypatch):
    # Nothing listens on port 9 of loopback.
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    monkeypatch.delenv("MINIONS_DEBUG", raising=False)
    with pytest.raises(minions.MinionsError) as e:
        minions.connect(nats="nats://127.0.0.1:9", store=fleet.store_url).workers()
    plain = str(e.value)
    assert plain.startswith("NATS at nats://127.0.0.1:9 refused the connection"), plain
    assert "\n" not in plain and "backtrace" not in plain, plain
    monkeypatch.setenv("MINIONS_DEBUG", "1")
    with pytest.raises(minions.MinionsError) as e:
        minions.connect(nats="nats://127.0.0.1:9", store=fleet.store_url).workers()
    detail = str(e.value)
    assert detail.startswith("NATS at nats://127.0.0.1:9") and "backtrace" in detail, detail


def test_generation_jobs_give_texts(client, fleet, tmp_path):
    gguf = os.environ.get("MINIONS_TEST_GGUF")
    if not gguf:
        pytest.fail("MINIONS_TEST_GGUF is not set: source deploy/tools.sh first")
    client.models.push(gguf, name="smollm2")
    assert "smollm2" in {m["name"] for m in client.models.list()}
    prompts = pa.array([f"Count from {i} to {i + 3}:" for i in range(6)])
    job = client.submit("smollm2", prompts, ids=[f"p{i}" for i in range(6)], max_tokens=8, shard_size=3)
    job.wait(timeout=600)
    rows = job.collect()
    assert [r["id"] for r in rows] == [f"p{i}" for i in range(6)]
    assert all(r["completion_tokens"] > 0 and r["finish_reason"] in ("stop", "length") for r in rows)
    t = job.collect(format="arrow")
    assert t.column_names == ["row", "id", "text", "finish_reason", "prompt_tokens", "completion_tokens", "error"]
    assert t.column("text").to_pylist() == [r["text"] for r in rows]
    out = tmp_path / "answers.parquet"
    fleet.cli("collect", job.id, "--output", str(out))
    back = pq.read_table(out)
    assert back.column("text").to_pylist() == [r["text"] for r in rows]
    assert back.column("id").to_pylist() == [f"p{i}" for i in range(6)]
    print(f"generation job {job.id}: {sum(r['completion_tokens'] for r in rows)} tokens, first answer {rows[0]['text']!r}")


def test_speech_jobs_give_transcripts(client, fleet, tmp_path):
    model = os.environ.get("MINIONS_WHISPER_TINY_EN")
    clips = os.environ.get("MINIONS_SPEECH_CLIPS")
    if not model or not clips:
        pytest.fail("MINIONS_WHISPER_TINY_EN or MINIONS_SPEECH_CLIPS is not set: source deploy/tools.sh --test first")
    client.models.push(model, name="tiny-en")
    folder = tmp_path / "calls"
    folder.mkdir()
    for name in ("goforward.wav", "numbers.wav"):
        (folder / name).write_bytes((Path(clips) / name).read_bytes())
    (folder / "notes.txt").write_text("not chosen by the glob")
    # A list of temperatures is Whisper's fallback; each file is a shard.
    job = client.submit("tiny-en", str(folder), glob="*.wav", temperature=[0.0, 0.4], shard_size=1)
    job.wait(timeout=600)
    rows = job.collect()
    assert [Path(r["id"]).name for r in rows] == ["goforward.wav", "numbers.wav"], rows
    # The reference engine's text for these clips (tests/fixtures/speech).
    assert [r["text"] for r in rows] == ["Go forward 10 meters.", "33 for 692."], rows
    assert all(r["segments"] and 0 < r["duration"] < 30 and "error" not in r for r in rows), rows
    t = job.collect(format="arrow")
    assert t.column_names == ["row", "id", "text", "language", "duration", "segments", "error"]
    assert t.column("segments").to_pylist() == [r["segments"] for r in rows]
    subs = tmp_path / "subs"
    assert job.collect(output=subs, format="srt")["rows"] == 2
    assert sorted(p.name for p in subs.iterdir()) == ["goforward.srt", "numbers.srt"]
    with pytest.raises(ValueError, match="srt"):
        job.collect(output=tmp_path / "x", format="mp3")
    print(f"speech job {job.id}: {rows[0]['text']!r}, {rows[1]['text']!r}")


def _moto_endpoint(server: subprocess.Popen, log: Path, timeout: float = 30) -> str:
    """The endpoint moto_server bound (started with `-p 0`), from its
    ` * Running on http://127.0.0.1:PORT` line; fails with its log tail when
    it exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        m = re.search(r"Running on (http://127\.0\.0\.1:(\d+))", text)
        if m and m.group(2) != "0":
            return m.group(1)
        tail = "\n".join(text.splitlines()[-20:])
        if server.poll() is not None:
            raise AssertionError(f"moto_server exited {server.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            raise AssertionError(f"moto_server printed no 'Running on' line within {timeout:.0f} s:\n{tail}")
        time.sleep(0.1)


def test_a_parquet_file_in_s3_submits(client, fleet, tmp_path, monkeypatch):
    moto = os.environ.get("MINIONS_MOTO_BIN")
    if not moto:
        pytest.fail("MINIONS_MOTO_BIN is not set: source deploy/tools.sh --test first")
    log = tmp_path / "moto.log"
    with open(log, "w") as out:
        # -p 0: moto_server binds a free port itself and prints which.
        server = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", "0"], stdout=out, stderr=subprocess.STDOUT)
    try:
        endpoint = _moto_endpoint(server, log)
        # Straight to loopback, whatever proxy the environment names.
        http = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        http.open(urllib.request.Request(f"{endpoint}/inputs", data=b"", method="PUT"), timeout=30)
        path = tmp_path / "docs.parquet"
        pq.write_table(pa.table({"body": texts(300), "doc_id": [f"d{i}" for i in range(300)]}), path)
        http.open(urllib.request.Request(f"{endpoint}/inputs/team/docs.parquet", data=path.read_bytes(), method="PUT", headers={"Content-Type": "application/octet-stream"}), timeout=30)
        for k, v in {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
        }.items():
            monkeypatch.setenv(k, v)
        job = client.submit(fleet.model, "s3://inputs/team/docs.parquet", text_field="body", id_field="doc_id")
        assert job.report["records"] == 300
        job.wait(timeout=600)
        t = job.collect(format="arrow")
        assert t.column("id").to_pylist() == [f"d{i}" for i in range(300)]
        with pytest.raises(minions.MinionsError, match="s3://inputs/nothing.parquet"):
            client.submit(fleet.model, "s3://inputs/nothing.parquet", text_field="body")
    finally:
        server.terminate()
        server.wait(10)


def test_cancel_ends_the_wait(client, fleet):
    job = client.submit(fleet.model, texts(3000, seed=11), shard_size=10)
    said = job.cancel()
    assert job.id in said
    with pytest.raises(minions.JobFailed, match="ended cancelled") as e:
        job.wait(timeout=300, interval=0.5)
    st = e.value.status
    print(f"cancelled job {job.id}: {st['done']} of {st['shards']} shards ran before the cancel took")
    assert st["state"] == "cancelled" and st["done"] < st["shards"]


def test_team_and_priority_reach_the_job(client, fleet):
    job = client.submit(fleet.model, texts(20, seed=3), team="research", priority="high", shard_size=5)
    st = job.status()
    assert st["team"] == "research" and st["priority"] == "high", st
    job.wait(timeout=300, interval=0.5)
    assert len(job.collect()) == 20
    with pytest.raises(ValueError, match="urgent"):
        client.submit(fleet.model, ["a"], priority="urgent")
    with pytest.raises(minions.MinionsError, match="team"):
        client.submit(fleet.model, ["a"], team="no spaces")

"""A Minions producer written from schemas/WIRE.md alone.

Plain Python with nats-py and msgpack: no Minions code, no bindings. It
submits an embedding job the way WIRE.md §6.2 prescribes and reads the
job's outputs back (§4.7, §6.4). The section numbers in the comments are
WIRE.md's; where this file and WIRE.md disagree, one of them has a bug.

Only a local-directory store (``file:///dir`` or a bare path, §5.2) is
supported.

As a program:

    python wire_producer.py submit --nats URL --store file:///dir \
        --model minilm --input texts.jsonl [--shard-size 256] [--job ID]
    python wire_producer.py collect --store file:///dir JOB --output x.npy
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import secrets
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import msgpack
import nats
import nats.errors
import nats.js.api
import nats.js.errors

SCHEMA_VERSION = 1  # §1.3

# §1.4 size limits, checked before decoding.
MAX_SPEC_BYTES = 1 << 20
MAX_MANIFEST_BYTES = 1 << 20
MAX_SHARD_INPUT_BYTES = 256 << 20
MAX_SHARD_OUTPUT_BYTES = 1 << 30
MAX_TASK_BYTES = 64 << 10
MAX_SHARD_RECORDS = 1_000_000
MAX_TEXT_BYTES = 1 << 20

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # §2


def check_id(kind: str, value: str) -> str:
    if not _ID.match(value) or not value.isascii():
        raise ValueError(f"{kind} {value!r} is not a valid id (WIRE.md §2)")
    return value


def now_ms() -> int:
    return int(time.time() * 1000)  # §1.5


def shard_key(shard: int) -> str:
    return f"{shard:08d}"  # §5.1: at least 8 digits


def spec_key(job: str) -> str:
    return f"jobs/{job}/spec.msgpack"


def input_key(job: str, shard: int) -> str:
    return f"jobs/{job}/inputs/{shard_key(shard)}.msgpack"


def output_key(job: str, shard: int) -> str:
    return f"jobs/{job}/outputs/{shard_key(shard)}.msgpack"


def model_name_key(name: str) -> str:
    return f"models/names/{name}.msgpack"


def shard_rows(records: int, shard_size: int, shard: int) -> int:
    """Records in `shard` (§4.5 invariants)."""
    return max(0, min(shard_size, records - shard * shard_size))


# ---------------------------------------------------------------------------
# MessagePack (§1)


def encode(doc: dict) -> bytes:
    # Maps keyed by field name; bytes as bin (use_bin_type, the default).
    return msgpack.packb(doc, use_bin_type=True)


def decode(what: str, data: bytes, limit: int) -> dict:
    """§1.3: refuse oversize bytes, then check `v`, then use the fields."""
    if len(data) > limit:
        raise ValueError(f"{what} is {len(data)} bytes; the limit is {limit}")
    doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(doc, dict) or "v" not in doc:
        raise ValueError(f"{what} is not a map with a schema version `v`")
    if doc["v"] != SCHEMA_VERSION:
        raise ValueError(
            f"{what} has schema version {doc['v']}; this producer reads version "
            f"{SCHEMA_VERSION} only"
        )
    return doc


# ---------------------------------------------------------------------------
# A local-directory store (§5.2, §5.3)


class AlreadyExists(Exception):
    pass


class DirStore:
    """Keys are relative paths under a directory. Every put is atomic:
    the bytes are staged beside the key as `<key>#<n>` (a name the store's
    listings skip, §5.3) and then renamed (plain put) or hard-linked
    without replacing (create-only) into place."""

    def __init__(self, url: str):
        if url.startswith("file://"):
            parsed = urllib.parse.urlparse(url)
            if parsed.netloc not in ("", "localhost"):
                raise ValueError(f"store URL {url!r}: a file:// URL has no host")
            root = urllib.parse.unquote(parsed.path)
        elif "://" in url:
            raise ValueError(f"store URL {url!r}: only file:// stores are supported here")
        else:
            root = url
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def get(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def _stage(self, dest: Path, data: bytes) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while True:
            staged = dest.with_name(f"{dest.name}#{n}")
            try:
                fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                n += 1
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return staged

    def put(self, key: str, data: bytes) -> None:
        dest = self.path(key)
        staged = self._stage(dest, data)
        os.replace(staged, dest)

    def put_create_only(self, key: str, data: bytes) -> None:
        dest = self.path(key)
        staged = self._stage(dest, data)
        try:
            os.link(staged, dest)
        except FileExistsError as e:
            raise AlreadyExists(key) from e
        finally:
            os.unlink(staged)


# ---------------------------------------------------------------------------
# Submitting (§6.2)


@dataclass
class Submitted:
    job: str
    shards: int
    records: int
    shard_size: int
    published: int  # tasks published (not skipped as done)
    duplicates: int  # publishes the work stream already held (§6.2 step 6)


def read_model_record(store: DirStore, name: str) -> dict:
    """§6.2 step 1, §4.9: the ModelRecord at models/names/<name>.msgpack."""
    check_id("model name", name)
    key = model_name_key(name)
    if not store.exists(key):
        raise LookupError(f"no model named {name!r} in the store ({key} is missing)")
    rec = decode("model record", store.get(key), MAX_MANIFEST_BYTES)
    if not re.fullmatch(r"[0-9a-f]{64}", rec["hash"]):
        raise ValueError(f"model record {key} has a malformed hash")
    return rec


def new_job_id() -> str:
    # Any valid JobId works (§2); this one is time-ordered and random.
    return f"py-{now_ms():x}-{secrets.token_hex(4)}"


def _input_description(texts: Sequence[str], source: str) -> dict:
    # The input as a JSONL file of {"text": ...} lines: its bytes give
    # `sha256` and `bytes` (§4.5 InputDescription).
    blob = b"".join(
        json.dumps({"text": t}, ensure_ascii=False).encode() + b"\n" for t in texts
    )
    return {
        "source": source,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "bytes": len(blob),
        "text_field": "text",
        "id_field": None,
    }


def _same_job(old: dict, new: dict) -> bool:
    """§6.2 step 4: a resubmit when these all match."""
    return (
        old["input"]["sha256"] == new["input"]["sha256"]
        and old["model_hash"] == new["model_hash"]
        and old["shard_size"] == new["shard_size"]
        and old["input"]["text_field"] == new["input"]["text_field"]
        and old["records"] == new["records"]
    )


def task_of(spec: dict, shard: int) -> dict:
    """§4.1: every field of a ShardTask follows from the spec."""
    return {
        "v": SCHEMA_VERSION,
        "job": spec["job"],
        "shard": shard,
        "shards": spec["shards"],
        "rows": shard_rows(spec["records"], spec["shard_size"], shard),
        "first_row": shard * spec["shard_size"],
        "model_hash": spec["model_hash"],
        "family": spec["family"],
        "max_batch": spec["max_batch"],
        "precision": spec["precision"],
    }


async def _team_quota(js, team: str) -> int:
    """The team's quota (§3.5, §4.13); 0 (none) when the policies cannot be
    read, as for the Minions programs."""
    try:
        kv = await js.key_value("MINIONS_TEAMS")
        entry = await kv.get("policy")
        teams = decode("team policies", entry.value, 1 << 20)["teams"]
        return int(teams.get(team, {}).get("quota", 0))
    except (nats.errors.Error, ValueError, KeyError, TypeError, AttributeError):
        return 0


async def ensure_job_consumer(js, work, spec: dict) -> None:
    """§3.4: the job's own durable pull consumer on MINIONS_WORK, made where
    missing (one that exists is left as it is) with the work stream's
    settings, max ack pending capped at the team's quota, and the spec's
    scheduling facts as metadata."""
    job = spec["job"]
    name = f"job-{job}"
    try:
        await js.consumer_info("MINIONS_WORK", name)
        return
    except nats.js.errors.NotFoundError:
        pass
    meta = work.config.metadata or {}

    def setting(key: str, default: int) -> int:
        try:
            return int(meta[key])
        except (KeyError, ValueError):
            return default

    team = spec.get("team", "default")
    needs = spec.get("needs") or {"memory_mb": 0, "devices": []}
    max_ack_pending = setting("minions.max_ack_pending", 20_000)
    quota = await _team_quota(js, team)
    if quota > 0:
        max_ack_pending = min(max_ack_pending, quota)
    config = nats.js.api.ConsumerConfig(
        # `name` as well as `durable_name`: nats-py then creates it on
        # $JS.API.CONSUMER.CREATE.MINIONS_WORK.<name>.<filter>, the form a
        # least-privilege producer may use (§3.4).
        name=name,
        durable_name=name,
        description=f"Minions job {job} (team {team})",
        filter_subject=f"minions.work.{job}.*",
        ack_policy=nats.js.api.AckPolicy.EXPLICIT,
        ack_wait=setting("minions.ack_wait_ms", 60_000) / 1000,
        max_deliver=setting("minions.max_deliver", 5),
        max_ack_pending=max_ack_pending,
        max_waiting=setting("minions.max_waiting", 20_000),
        num_replicas=work.config.num_replicas,
        metadata={
            "minions.job": job,
            "minions.team": team,
            "minions.priority": spec.get("priority", "normal"),
            "minions.preemptible": "true" if spec.get("preemptible") else "false",
            "minions.memory_mb": str(needs["memory_mb"]),
            "minions.devices": ",".join(needs["devices"]),
            "minions.model": spec["model_hash"],
            "minions.created_ms": str(spec["created_ms"]),
        },
    )
    await js.add_consumer("MINIONS_WORK", config)


def _servers(nats_url: str) -> list[str]:
    # A cluster's servers may be given comma-separated.
    return [u.strip() for u in nats_url.split(",") if u.strip()]


async def submit_embedding_job(
    nats_url: str,
    store_url: str,
    model: str,
    texts: Sequence[str],
    *,
    shard_size: int = 256,
    job: str | None = None,
    max_batch: int = 0,
    precision: str = "f32",
    source: str = "wire_producer.py",
) -> Submitted:
    """Submits `texts` as an embedding job, in WIRE.md §6.2's order."""
    if not 1 <= shard_size <= MAX_SHARD_RECORDS:
        raise ValueError(f"shard_size {shard_size} is outside 1..={MAX_SHARD_RECORDS}")
    if precision not in ("f32", "int8"):
        raise ValueError(f"precision {precision!r} is not f32 or int8")
    if not texts:
        raise ValueError("no texts to submit")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text {i} is not a str")
        if len(t.encode()) > MAX_TEXT_BYTES:
            raise ValueError(f"text {i} is longer than {MAX_TEXT_BYTES} bytes")
    store = DirStore(store_url)
    nc = await nats.connect(servers=_servers(nats_url))
    try:
        return await _submit(nc, store, model, texts, shard_size, job, max_batch, precision, source)
    finally:
        await nc.close()


async def _submit(nc, store, model, texts, shard_size, job, max_batch, precision, source):
    js = nc.jetstream()
    # 0. The streams must exist. This producer creates none (§3.6: `minions
    # admin init`, or any Minions program with the permission, does).
    streams = {}
    for stream in ("MINIONS_WORK", "MINIONS_EVENTS"):
        try:
            streams[stream] = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            raise RuntimeError(
                f"stream {stream} does not exist: run `minions admin init` or start a "
                "Minions worker or watchdog first"
            ) from None

    # 1. Resolve the model name.
    rec = read_model_record(store, model)
    if rec["family"] != "bert-embedding":
        raise ValueError(f"model {model!r} is a {rec['family']} model, not bert-embedding")

    # 2. Choose a job id.
    job = check_id("job id", job or new_job_id())

    # 3. Cut the records into shards (put below, unless the id was used before).
    records = len(texts)
    shards = (records + shard_size - 1) // shard_size
    inputs = [
        {
            "v": SCHEMA_VERSION,
            "job": job,
            "shard": s,
            "first_row": s * shard_size,
            "ids": None,
            "texts": list(texts[s * shard_size : (s + 1) * shard_size]),
            # `records` is for generation jobs; omitted when empty (§4.6).
        }
        for s in range(shards)
    ]
    spec = {
        "v": SCHEMA_VERSION,
        "job": job,
        "model_name": model,
        "model_hash": rec["hash"],
        "family": rec["family"],
        "input": _input_description(texts, source),
        "shard_size": shard_size,
        "max_batch": max_batch,
        "precision": precision,
        "shards": shards,
        "records": records,
        "skipped": 0,
        "created_ms": now_ms(),
    }
    resubmit = store.exists(spec_key(job))
    if not resubmit:
        for doc in inputs:
            store.put(input_key(job, doc["shard"]), encode(doc))

    # 4. Write the job spec, create-only.
    try:
        store.put_create_only(spec_key(job), encode(spec))
    except AlreadyExists:
        resubmit = True
    if resubmit:
        old = decode("job spec", store.get(spec_key(job)), MAX_SPEC_BYTES)
        if not _same_job(old, spec):
            raise ValueError(f"job {job} already exists with a different input")
        # Tasks and consumer from the stored spec, as retry and reconcile
        # make them (§6.2, "On a resubmit").
        spec = old

    # 4. Then the job's own consumer, where missing (§3.4).
    await ensure_job_consumer(js, streams["MINIONS_WORK"], spec)
    if resubmit:
        # The input is the same: put back inputs missing from the store.
        for doc in inputs:
            if not store.exists(input_key(job, doc["shard"])):
                store.put(input_key(job, doc["shard"]), encode(doc))

    # 5. The `submitted` event, confirmed, on shard 0, signed as `cli`.
    at = now_ms()
    event = {
        "v": SCHEMA_VERSION,
        "job": job,
        "shard": 0,
        "worker": "cli",
        "host": "cli",
        "attempt": 0,
        "at_ms": at,
        "kind": "submitted",
        "shards": spec["shards"],
    }
    await js.publish(
        f"minions.events.{job}.0.cli",
        encode(event),
        headers={"Nats-Msg-Id": f"{job}/0/cli/0/submitted/{at}"},
    )
    # 6. One ShardTask per shard, `Nats-Msg-Id: <job>/<shard>`; on a
    # resubmit skip shards whose output exists.
    published = duplicates = 0
    for s in range(spec["shards"]):
        if resubmit and store.exists(output_key(job, s)):
            continue
        task = encode(task_of(spec, s))
        if len(task) > MAX_TASK_BYTES:
            raise ValueError(f"task of shard {s} is {len(task)} bytes")
        ack = await js.publish(
            f"minions.work.{job}.{s}", task, headers={"Nats-Msg-Id": f"{job}/{s}"}
        )
        published += 1
        duplicates += bool(ack.duplicate)
    # 7. Nudge the schedulers when the stream stored a task anew; best
    # effort (a lost nudge costs only the wait for the next schedule).
    if published > duplicates:
        try:
            await nc.publish("minions.queued", job.encode())
            await nc.flush()
        except nats.errors.Error:
            pass
    return Submitted(
        job=job,
        shards=spec["shards"],
        records=spec["records"],
        shard_size=spec["shard_size"],
        published=published,
        duplicates=duplicates,
    )


# ---------------------------------------------------------------------------
# Reading outputs (§4.7, §6.4)


def read_spec(store_url: str, job: str) -> dict:
    store = DirStore(store_url)
    check_id("job id", job)
    return decode("job spec", store.get(spec_key(job)), MAX_SPEC_BYTES)


def missing_outputs(store_url: str, job: str, shards: int) -> list[int]:
    """Shards whose output object is not in the store yet."""
    store = DirStore(store_url)
    return [s for s in range(shards) if not store.exists(output_key(job, s))]


def read_embeddings(store_url: str, job: str):
    """The job's `records × dim` float32 matrix, row i = i-th input record."""
    import numpy as np

    store = DirStore(store_url)
    spec = read_spec(store_url, job)
    parts = []
    dim = None
    for s in range(spec["shards"]):
        raw = store.get(output_key(job, s))
        out = decode(f"output of shard {s}", raw, MAX_SHARD_OUTPUT_BYTES)
        rows = shard_rows(spec["records"], spec["shard_size"], s)
        if out["job"] != job or out["shard"] != s or out["rows"] != rows:
            raise ValueError(
                f"output of shard {s} is for job {out['job']} shard {out['shard']} "
                f"with {out['rows']} rows; expected job {job} shard {s} with {rows}"
            )
        if out["first_row"] != s * spec["shard_size"]:
            raise ValueError(f"output of shard {s} starts at row {out['first_row']}")
        payload = out["payload"]
        if payload.get("type") != "embeddings":
            raise ValueError(f"output of shard {s} holds {payload.get('type')!r}, not embeddings")
        data = payload["data"]
        if not isinstance(data, (bytes, bytearray)):
            raise ValueError(f"output of shard {s}: `data` is not MessagePack bin")
        if dim is None:
            dim = payload["dim"]
        if payload["dim"] != dim or len(data) != rows * dim * 4:
            raise ValueError(
                f"output of shard {s} holds {len(data)} bytes of dimension {payload['dim']} "
                f"for {rows} rows"
            )
        parts.append(np.frombuffer(data, dtype="<f4").reshape(rows, dim))
    return np.concatenate(parts).astype(np.float32, copy=False)


# ---------------------------------------------------------------------------
# Command line


def _read_jsonl(path: str, field: str) -> list[str]:
    """The texts of a JSON Lines file, read as `minions submit` reads them
    (§6.2, "Reading the input"): a line ends at a newline byte; one of ASCII
    whitespace only is skipped; any other must be a JSON object, valid UTF-8
    with no lone surrogate, whose `field` is a string (which may be empty)."""
    texts = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip(b" \t\r\n\f")
            if not line:
                continue
            try:
                obj = json.loads(line.decode("utf-8"))
                # Python's json accepts a lone surrogate escape; UTF-8 cannot hold it.
                json.dumps(obj, ensure_ascii=False).encode("utf-8")
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not valid JSON: {e}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
                raise ValueError(f"{path}:{n}: no string field {field!r}")
            texts.append(obj[field])
    return texts


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    store = os.environ.get("MINIONS_STORE")
    store_default = {"default": store} if store else {"required": True}
    s = sub.add_parser("submit", help="submit an embedding job; prints the job id")
    s.add_argument("--nats", default=os.environ.get("MINIONS_NATS_URL", "nats://127.0.0.1:4222"))
    s.add_argument("--store", **store_default)
    s.add_argument("--model", required=True)
    s.add_argument("--input", required=True, help="JSON Lines with a text field")
    s.add_argument("--text-field", default="text")
    s.add_argument("--shard-size", type=int, default=256)
    s.add_argument("--job")
    c = sub.add_parser("collect", help="write a finished job's vectors as .npy")
    c.add_argument("--store", **store_default)
    c.add_argument("job")
    c.add_argument("--output", required=True)
    a = p.parse_args(list(argv) if argv is not None else None)
    if a.cmd == "submit":
        texts = _read_jsonl(a.input, a.text_field)
        r = asyncio.run(
            submit_embedding_job(
                a.nats, a.store, a.model, texts, shard_size=a.shard_size, job=a.job, source=a.input
            )
        )
        print(r.job)
        print(f"{r.records} records in {r.shards} shards; {r.published} published", file=sys.stderr)
    else:
        import numpy as np

        spec = read_spec(a.store, a.job)
        missing = missing_outputs(a.store, a.job, spec["shards"])
        if missing:
            print(f"{len(missing)} of {spec['shards']} shards have no output yet", file=sys.stderr)
            return 1
        np.save(a.output, read_embeddings(a.store, a.job))
    return 0


if __name__ == "__main__":
    sys.exit(main())

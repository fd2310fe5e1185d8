"""Minions from Python: submit batch inference jobs to a fleet, follow them,
and collect their results as numpy arrays or Arrow tables.

    import minions
    fleet = minions.connect()                       # MINIONS_* variables / settings file, like the CLI
    fleet.models.push("./all-MiniLM-L6-v2", name="minilm")
    job = fleet.submit("minilm", df["text"])        # a list, pandas Series, pyarrow or numpy array
    job = fleet.submit("minilm", "docs.parquet", text_field="body", id_field="doc_id")
    job.wait(progress=True)                         # a progress bar in a terminal or notebook
    vectors = job.collect()                         # numpy float32 [N, dim], input order
    table = job.collect(format="arrow")             # row, id, vector (or text) as a pyarrow Table

Every call runs the same Rust code as the ``minions`` command line, with the
GIL released while it works or waits; failures raise :class:`MinionsError`
with the message the command line would print, bad options ``ValueError``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Iterable, Optional, Sequence, Union

from ._native import Fleet as _NativeFleet
from ._native import MinionsError, __version__

__all__ = ["connect", "Fleet", "Job", "Models", "MinionsError", "JobFailed", "__version__"]

PathLike = Union[str, "os.PathLike[str]"]


class JobFailed(MinionsError):
    """A job ended without every shard done (some failed for good, or it was
    cancelled). ``status`` holds the job's last status."""

    def __init__(self, message: str, status: dict):
        super().__init__(message)
        self.status = status


def connect(
    nats: Optional[str] = None,
    store: Optional[str] = None,
    *,
    config: Optional[PathLike] = None,
    nats_creds: Optional[PathLike] = None,
    nats_nkey: Optional[PathLike] = None,
    nats_user: Optional[str] = None,
    nats_ca: Optional[PathLike] = None,
    replicas: Optional[int] = None,
) -> "Fleet":
    """A handle on a fleet. Anything not given comes from the same places as
    for the command line: ``MINIONS_NATS_URL``, ``MINIONS_STORE``,
    ``MINIONS_NATS_CREDS`` ... and the settings file (``MINIONS_CONFIG`` or the
    per-user one). ``nats`` may list a cluster's servers separated by commas;
    ``store`` is ``file:///dir`` or ``s3://bucket[/prefix]``. Connects to
    nothing until a call needs it."""
    flags: list[str] = []
    for flag, value in (
        ("--nats", nats),
        ("--store", store),
        ("--config", config),
        ("--nats-creds", nats_creds),
        ("--nats-nkey", nats_nkey),
        ("--nats-user", nats_user),
        ("--nats-ca", nats_ca),
        ("--replicas", replicas),
    ):
        if value is not None:
            flags += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return Fleet(_NativeFleet(flags))


class Models:
    """The fleet's models: ``fleet.models.push(path, name=...)``, ``.list()``."""

    def __init__(self, native: _NativeFleet):
        self._native = native

    def push(self, path: PathLike, name: str) -> str:
        """Uploads a model (an embedding model's folder, or a GGUF file) under
        ``name``; returns its content hash. Pushing the same files again
        uploads nothing."""
        return self._native.push_model(os.fspath(path), name)

    def list(self) -> list:
        """Every model in the store, as dicts."""
        return json.loads(self._native.list_models())


class Fleet:
    """A fleet reached through one NATS URL (or cluster) and one store."""

    def __init__(self, native: _NativeFleet):
        self._native = native
        self.models = Models(native)

    def __repr__(self) -> str:
        return f"minions.Fleet(nats={self._native.nats!r}, store={self._native.store!r})"

    def submit(
        self,
        model: str,
        data: Any,
        *,
        ids: Optional[Iterable[Any]] = None,
        text_field: Optional[str] = None,
        id_field: Optional[str] = None,
        job: Optional[str] = None,
        shard_size: Optional[int] = None,
        precision: Optional[str] = None,
        max_batch: Optional[int] = None,
        skip_bad: bool = False,
        max_tokens: Optional[int] = None,
        temperature: Union[float, Sequence[float], None] = None,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Optional[Sequence[str]] = None,
        team: Optional[str] = None,
        priority: Optional[str] = None,
        preemptible: bool = False,
        memory_mb: Optional[int] = None,
        devices: Optional[Sequence[str]] = None,
        glob: Optional[str] = None,
        language: Optional[str] = None,
        task: Optional[str] = None,
        timestamps: Optional[str] = None,
        beam_size: Optional[int] = None,
        initial_prompt: Optional[str] = None,
    ) -> "Job":
        """Submits a job and returns it (queued; see :meth:`Job.wait`).

        ``data`` is either the records — a list of strings, a pandas Series, a
        pyarrow Array or ChunkedArray, a numpy array of strings (texts, or
        prompts for a generation model), with ``ids`` optionally giving one
        id per record — or a file: a path or ``s3://bucket/key`` URL of a JSON
        Lines or Parquet (``.parquet``) file, read as ``minions submit --input``
        reads it, with ``text_field`` / ``id_field`` naming the field or
        column. ``team``, ``priority`` (``"low"``, ``"normal"``, ``"high"``),
        ``preemptible``, ``memory_mb`` and ``devices`` place the job in the
        fleet's sharing (fair share between teams, priority within one).

        For a speech model ``data`` is a JSON Lines file of ``{"id", "audio"}``
        lines, or a folder (local, or an ``s3://bucket/prefix/``) of audio
        files with ``glob`` choosing them (``"*.wav"``); ``language``,
        ``task`` (``"transcribe"``, ``"translate"``), ``timestamps``
        (``"segment"``, ``"none"``), ``beam_size``, ``initial_prompt`` and
        ``temperature`` (one value, or a list for Whisper's fallback) are
        ``minions submit``'s speech options. The other options are ``minions
        submit``'s, with its defaults.
        """
        flags = ["--model", model]
        # One temperature, or a speech job's list of them (comma-separated).
        if temperature is not None and not isinstance(temperature, (int, float)):
            temperature = ",".join(str(float(t)) for t in temperature)
        for flag, value in (
            ("--job", job),
            ("--shard-size", shard_size),
            ("--precision", precision),
            ("--max-batch", max_batch),
            ("--max-tokens", max_tokens),
            ("--temperature", temperature),
            ("--top-p", top_p),
            ("--top-k", top_k),
            ("--seed", seed),
            ("--team", team),
            ("--priority", priority),
            ("--memory-mb", memory_mb),
            ("--glob", glob),
            ("--language", language),
            ("--task", task),
            ("--timestamps", timestamps),
            ("--beam-size", beam_size),
            ("--initial-prompt", initial_prompt),
        ):
            if value is not None:
                flags += [flag, str(value)]
        for s in stop or ():
            flags += ["--stop", s]
        if skip_bad:
            flags.append("--skip-bad")
        if preemptible:
            flags.append("--preemptible")
        if devices:
            flags += ["--devices", ",".join(devices)]
        if isinstance(data, (str, os.PathLike)):
            if ids is not None:
                raise ValueError("ids= goes with records in memory; a file names its id column with id_field=")
            if text_field is not None:
                flags += ["--text-field", text_field]
            if id_field is not None:
                flags += ["--id-field", id_field]
            report = self._native.submit_file(flags, os.fspath(data))
        else:
            if text_field is not None or id_field is not None:
                raise ValueError("text_field= and id_field= name a file's fields; give records in memory with ids=")
            texts = _texts(data)
            id_list = None if ids is None else [str(i) for i in _values(ids, "ids")]
            if id_list is not None and len(id_list) != len(texts):
                raise ValueError(f"{len(id_list)} ids for {len(texts)} records; give one id per record")
            report = self._native.submit_texts(flags, texts, id_list, _describe(data, len(texts)))
        return Job(self, report["job"], report)

    def job(self, job_id: str) -> "Job":
        """A handle on an existing job."""
        return Job(self, job_id, None)

    def workers(self) -> list:
        """Every worker that sent a heartbeat lately: state, device, running
        and done shards, as dicts (``minions worker list --json``)."""
        return json.loads(self._native.workers())


class Job:
    """A submitted job. ``report`` holds what submit did (records, shards,
    published ...) when this handle came from :meth:`Fleet.submit`."""

    def __init__(self, fleet: Fleet, job_id: str, report: Optional[dict]):
        self.fleet = fleet
        self.id = job_id
        self.report = report

    def __repr__(self) -> str:
        return f"minions.Job({self.id!r})"

    def __str__(self) -> str:
        return self.id

    def status(self) -> dict:
        """The job's progress now: ``state`` (pending, running, done, failed,
        cancelled), shard counts, records done, rate, ETA, failed shards."""
        return json.loads(self.fleet._native.status(self.id))

    def cancel(self) -> str:
        """Removes the job's pending shards and stops its running ones."""
        return self.fleet._native.cancel(self.id)

    def wait(self, progress: bool = False, timeout: Optional[float] = None, interval: float = 1.0) -> dict:
        """Waits until the job ends and returns its last status. With
        ``progress``, shows a bar (tqdm's, in terminals and notebooks, when
        tqdm is installed; a line on stderr otherwise). Raises
        :class:`JobFailed` when it ends with failed shards or cancelled,
        ``TimeoutError`` after ``timeout`` seconds (the job goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = _Bar(self.id) if progress else None
        try:
            while True:
                st = self.status()
                if bar is not None:
                    bar.update(st)
                if st["state"] in ("done", "failed", "cancelled"):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"job {self.id} is still {st['state']} after {timeout} s "
                        f"({st['done']} of {st['shards']} shards done)"
                    )
                time.sleep(interval)
        finally:
            if bar is not None:
                bar.close()
        if st["state"] != "done":
            raise JobFailed(
                f"job {self.id} ended {st['state']}: {st['done']} of {st['shards']} shards done, "
                f"{st['failed']} failed; see `minions status {self.id}`",
                st,
            )
        return st

    def collect(self, format: str = "numpy", output: Optional[PathLike] = None) -> Any:
        """The finished job's results in input order.

        - ``format="numpy"`` (default): an embedding job's vectors as a numpy
          float32 array ``[records, dim]``; a generation job's results as a
          list of dicts (``id``, ``text``, ``finish_reason``,
          ``prompt_tokens``, ``completion_tokens``, and ``error`` when a
          record could not run).
          A speech job's transcripts as a list of dicts, one per audio file
          (``id``, ``text``, ``language``, ``segments`` as a list of
          ``{"start", "end", "text"}`` in seconds, ``duration``, and
          ``error`` when a file could not be transcribed), as ``minions
          collect`` writes its JSON lines.
        - ``format="arrow"``: a pyarrow Table: ``row`` (uint64), ``id``
          (string, when the job has ids), then ``vector`` (fixed-size list of
          float32) or ``text``, ``finish_reason``, ``prompt_tokens``,
          ``completion_tokens``, ``error``; for a speech job ``text``,
          ``language``, ``duration`` (float64 seconds), ``segments`` (list
          of struct ``start``, ``end``, ``text``), ``error``.
        - ``output=PATH``: writes a file as ``minions collect`` does (``.npy``,
          ``.parquet``, or JSON Lines; ``format="openai"`` for OpenAI batch
          output lines; ``format="srt"`` or ``"vtt"`` for a folder of subtitle
          files of a speech job) and returns its report.
        """
        if output is not None:
            fmt = None if format in ("numpy", "jsonl") else format
            return self.fleet._native.collect_to(self.id, os.fspath(output), fmt)
        if format not in ("numpy", "arrow"):
            raise ValueError(f'format {format!r}: use "numpy" or "arrow" (or output= for a file)')
        kind, ids, *rest = self.fleet._native.gather(self.id)
        if kind == "vectors":
            import numpy as np

            dim, data = rest
            vectors = np.frombuffer(data, dtype="<f4").reshape(-1, dim) if dim else np.zeros((0, 0), "<f4")
            if format == "numpy":
                return vectors
            import pyarrow as pa

            columns = {"row": pa.array(range(len(vectors)), pa.uint64())}
            if ids is not None:
                columns["id"] = pa.array(ids, pa.string())
            flat = pa.array(vectors.reshape(-1), pa.float32())
            columns["vector"] = pa.FixedSizeListArray.from_arrays(flat, dim)
            return pa.table(columns)
        if kind == "transcripts":
            return _transcripts(json.loads(rest[0]), format)
        results = json.loads(rest[0])
        rows = []
        for i, (rid, g) in enumerate(zip(ids, results)):
            r = {
                "id": rid,
                "text": g["text"],
                "finish_reason": g["finish_reason"],
                "prompt_tokens": g["prompt_tokens"],
                "completion_tokens": g["completion_tokens"],
            }
            if g.get("error") is not None:
                r["error"] = g["error"]
            rows.append(r)
        if format == "numpy":
            return rows
        import pyarrow as pa

        return pa.table(
            {
                "row": pa.array(range(len(rows)), pa.uint64()),
                "id": pa.array([r["id"] for r in rows], pa.string()),
                "text": pa.array([r["text"] for r in rows], pa.string()),
                "finish_reason": pa.array([r["finish_reason"] for r in rows], pa.string()),
                "prompt_tokens": pa.array([r["prompt_tokens"] for r in rows], pa.uint32()),
                "completion_tokens": pa.array([r["completion_tokens"] for r in rows], pa.uint32()),
                "error": pa.array([r.get("error") for r in rows], pa.string()),
            }
        )


def _transcripts(lines: list, format: str) -> Any:
    """A speech job's transcripts (``minions collect``'s JSON lines, parsed)
    as ``collect`` returns them in ``format``."""
    if format == "numpy":
        return lines
    import pyarrow as pa

    segment = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())])
    return pa.table(
        {
            "row": pa.array(range(len(lines)), pa.uint64()),
            "id": pa.array([t["id"] for t in lines], pa.string()),
            "text": pa.array([t["text"] for t in lines], pa.string()),
            "language": pa.array([t.get("language") for t in lines], pa.string()),
            "duration": pa.array([t["duration"] for t in lines], pa.float64()),
            "segments": pa.array([t["segments"] for t in lines], pa.list_(segment)),
            "error": pa.array([t.get("error") for t in lines], pa.string()),
        }
    )


def _values(data: Any, what: str) -> list:
    """A Python list of the values of a list-like (list, tuple, pandas Series
    or Index, pyarrow Array or ChunkedArray, numpy array, any iterable)."""
    if hasattr(data, "to_pylist"):  # pyarrow Array / ChunkedArray
        return data.to_pylist()
    if hasattr(data, "tolist"):  # numpy array, pandas Series / Index
        return data.tolist()
    if isinstance(data, (bytes, dict)):
        raise TypeError(f"{what}: expected a list-like of strings, got {type(data).__name__}")
    try:
        return list(data)
    except TypeError:
        raise TypeError(f"{what}: expected a list-like of strings or a file path, got {type(data).__name__}") from None


def _texts(data: Any) -> list:
    values = _values(data, "data")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            kind = "null" if v is None else type(v).__name__
            raise TypeError(f"data: record {i} is {kind}, expected a string")
    return values


def _describe(data: Any, n: int) -> str:
    """How the job spec names an in-memory input."""
    kind = type(data)
    name = getattr(data, "name", None)
    label = f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(name, str) and name:
        label += f" {name!r}"
    return f"{label} of {n} records (Python)"


class _Bar:
    """wait()'s progress: tqdm's bar when tqdm is there (its auto flavour
    draws widgets in notebooks), else one rewritten line on stderr."""

    def __init__(self, job: str):
        self._job = job
        self._tqdm = None
        self._last = ""
        try:
            from tqdm.auto import tqdm

            self._tqdm = tqdm(total=None, desc=job, unit="rec", dynamic_ncols=True)
        except ImportError:
            pass

    def update(self, st: dict) -> None:
        if self._tqdm is not None:
            if self._tqdm.total != st["records"]:
                self._tqdm.total = st["records"]
            self._tqdm.n = st["records_done"]
            post = {"shards": f"{st['done']}/{st['shards']}", "state": st["state"]}
            if st.get("failed"):
                post["failed"] = st["failed"]
            self._tqdm.set_postfix(post, refresh=False)
            self._tqdm.refresh()
            return
        eta = st.get("eta_secs")
        line = (
            f"{self._job}: {st['state']} {st['records_done']}/{st['records']} records, "
            f"{st['done']}/{st['shards']} shards, {st['rate']:.1f} rec/s"
            + (f", ETA {eta:.0f} s" if eta is not None else "")
        )
        if line != self._last:
            sys.stderr.write("\r" + line)
            sys.stderr.flush()
            self._last = line

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self._last:
            sys.stderr.write("\n")

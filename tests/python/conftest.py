"""Shared pytest fixtures for the Python tests: one local Minions fleet per
session (`minions dev`: nats-server, a watchdog and two workers) with
all-MiniLM-L6-v2 pushed as `minilm`.

Needs the binaries (`cargo build --workspace --bins`; MINIONS_BIN_DIR picks
another folder than target/debug), NATS_SERVER_BIN and MINIONS_TEST_MODEL_DIR
(`source deploy/tools.sh`; tests/python/run.sh does it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "minilm"
WORKERS = 2
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Fleet:
    """A running local fleet and how to talk to it.

    Attributes: `nats_url`, `store_url` (file:///...), `store_dir`, `bin_dir`,
    `model` (the pushed model's name), `env` (os.environ plus
    MINIONS_NATS_URL and MINIONS_STORE, for CLI subprocesses)."""

    def __init__(self, bin_dir: Path, store_dir: Path, log_dir: Path):
        self.bin_dir = bin_dir
        self.nats_url = ""  # known once `start` has read it from `minions dev`
        self.store_dir = store_dir
        self.store_url = store_dir.as_uri()
        self.model = MODEL_NAME
        self.log_dir = log_dir
        self.env = dict(os.environ)
        self.env.pop("MINIONS_NATS_URL", None)
        self.env["MINIONS_STORE"] = self.store_url
        self._dev: subprocess.Popen | None = None

    def bin(self, name: str) -> Path:
        return self.bin_dir / name

    def run(self, *args: str, timeout: float = 300, input: str | None = None):
        """Runs `minions ARGS`; returns the CompletedProcess whatever its status."""
        return subprocess.run(
            [str(self.bin("minions")), *map(str, args)],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def cli(self, *args: str, timeout: float = 300, input: str | None = None) -> str:
        """Runs `minions ARGS` and returns its stdout; fails with its stderr
        when it exits non-zero."""
        p = self.run(*args, timeout=timeout, input=input)
        if p.returncode != 0:
            raise AssertionError(
                f"minions {' '.join(map(str, args))} exited {p.returncode}:\n"
                f"{p.stderr.strip()}\n{p.stdout.strip()}"
            )
        return p.stdout

    def status(self, job: str) -> dict:
        return json.loads(self.cli("status", job, "--json"))

    def wait_done(self, job: str, timeout: float = 180) -> dict:
        """Polls `minions status JOB --json` until the job has ended; fails
        unless it ended done."""
        deadline = time.monotonic() + timeout
        st: dict = {}
        while time.monotonic() < deadline:
            st = self.status(job)
            if st["state"] in ("done", "failed", "cancelled"):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(
                f"job {job} did not end within {timeout:.0f} s: {st.get('done')} of "
                f"{st.get('shards')} shards done, state {st.get('state')}\n"
                f"fleet log:\n{_tail(self.log_dir / 'dev.stderr')}"
            )
        assert st["state"] == "done", f"job {job} ended {st['state']}: {st.get('failed_shards')}"
        return st

    def collect(self, job: str, path: Path | str):
        """`minions collect JOB --output PATH.npy`, loaded with numpy."""
        import numpy as np

        self.cli("collect", job, "--output", str(path))
        return np.load(path)

    def workers(self) -> list[dict]:
        p = self.run("worker", "list", "--json", timeout=30)
        if p.returncode != 0:
            return []
        return json.loads(p.stdout)

    # -- lifecycle --------------------------------------------------------

    def start(self, data_dir: Path) -> None:
        """Starts `minions dev` with nats-server on a port it picks itself
        (`--port 0`), reads the URL from dev's `export MINIONS_NATS_URL=` line,
        then waits until the workers are up. Fails with dev's log tail when dev
        exits or START_TIMEOUT_S passes first."""
        out = open(self.log_dir / "dev.stdout", "w")
        err = open(self.log_dir / "dev.stderr", "w")
        self._dev = subprocess.Popen(
            [
                str(self.bin("minions")),
                "dev",
                "--workers",
                str(WORKERS),
                "--port",
                "0",
                "--data-dir",
                str(data_dir),
                "--dashboard",
                "off",
            ],
            env=self.env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            # Its own process group, so that a fleet that will not stop can be
            # killed with its children.
            start_new_session=True,
        )
        out.close()
        err.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        self.nats_url = self._read_nats_url(deadline)
        self.env["MINIONS_NATS_URL"] = self.nats_url
        while True:
            if self._dev.poll() is not None:
                raise RuntimeError(
                    f"minions dev exited {self._dev.returncode}:\n{_tail(self.log_dir / 'dev.stderr')}"
                )
            live = [w for w in self.workers() if w.get("state") in ("idle", "busy")]
            if len(live) >= WORKERS:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(live)} of {WORKERS} workers up after {START_TIMEOUT_S} s:\n"
                    f"{_tail(self.log_dir / 'dev.stderr')}"
                )
            time.sleep(0.3)

    def _read_nats_url(self, deadline: float) -> str:
        """The URL in the `export MINIONS_NATS_URL=...` line that `minions dev`
        prints on stdout once its nats-server listens."""
        stdout = self.log_dir / "dev.stdout"
        while True:
            try:
                text = stdout.read_text(errors="replace")
            except OSError:
                text = ""
            # Only whole lines: the line may be half written.
            m = re.search(r"^export MINIONS_NATS_URL=(\S+)\n", text, re.MULTILINE)
            if m:
                return m.group(1)
            if self._dev.poll() is not None:
                raise RuntimeError(
                    f"minions dev exited {self._dev.returncode} before printing MINIONS_NATS_URL:\n"
                    f"{_tail(self.log_dir / 'dev.stderr')}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"minions dev printed no MINIONS_NATS_URL within {START_TIMEOUT_S} s:\n"
                    f"{_tail(self.log_dir / 'dev.stderr')}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        dev, self._dev = self._dev, None
        if dev is None or dev.poll() is not None:
            return
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(dev.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            dev.wait(10)


def _bin_dir() -> Path:
    return Path(os.environ.get("MINIONS_BIN_DIR", REPO / "target" / "debug")).resolve()


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    bin_dir = _bin_dir()
    missing = [n for n in ("minions", "minions-worker", "minions-watchdog") if not (bin_dir / n).is_file()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not in {bin_dir}: build them (cargo build --workspace --bins) "
            "or set MINIONS_BIN_DIR"
        )
    model_dir = os.environ.get("MINIONS_TEST_MODEL_DIR")
    if not model_dir or not Path(model_dir).is_dir():
        pytest.fail("MINIONS_TEST_MODEL_DIR is not set to a folder: source deploy/tools.sh first")
    if not os.environ.get("NATS_SERVER_BIN"):
        pytest.fail("NATS_SERVER_BIN is not set: source deploy/tools.sh first")

    root = tmp_path_factory.mktemp("fleet")
    store_dir = root / "store"
    store_dir.mkdir()
    f = Fleet(bin_dir, store_dir, root)
    try:
        f.start(root / "nats")
        f.cli("model", "push", model_dir, "--name", MODEL_NAME)
        yield f
    finally:
        f.stop()


@pytest.fixture
def collect(fleet, tmp_path):
    """`collect(job) -> numpy array`: a job's vectors via `minions collect`."""

    def _collect(job: str):
        return fleet.collect(job, tmp_path / f"{job}.npy")

    return _collect

"""The reference engine's side of bench_speech (tests/bench/src/bin/bench_speech.rs):
CTranslate2's Whisper over the same speech clips, with segment timestamps,
window by window, windows of several files batched, on the CPU.

Run it through tests/bench/speech.sh, which installs the assets and the venv.

What it does, the same as bench_speech and worker/engine/src/speech/transcribe.rs:
  - every .wav under the clips folder, sorted by path, read with the standard
    library's `wave` (16 kHz, mono, 16-bit);
  - a file's next window starts at its seek (mel frames, 100 a second); its
    log-mel is computed from the 480,000 samples there, zero-padded, and
    normalised over that window alone (make_goldens.py's log_mel);
  - each round takes the next window of up to B unfinished files: one
    `encode` of their mels as one batch, one `generate` of the batch with the
    goldens' options (greedy, max_initial_timestamp_index=50, suppress_blank,
    suppress_tokens=[-1], max_length=448), prompt <|startoftranscript|>
    (plus <|en|><|transcribe|> for multilingual models), no conditioning on
    earlier windows;
  - each file's seek then moves by the seek rule of make_goldens.py
    (SEEK_RULE); a file is done when its seek passes its content; its text
    is made from its segments (zero-length or empty ones dropped).
The time of a run covers all of that, mel included; the best of the rounds
is kept. The encoder alone is timed per window on a batch of zeros.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "speech"))

import ctranslate2  # noqa: E402
import numpy as np  # noqa: E402

import make_goldens as g  # noqa: E402

MODEL_ENV = {"tiny.en": "MINIONS_WHISPER_TINY_EN", "base": "MINIONS_WHISPER_BASE"}
GOLDENS = os.path.join(ROOT, "tests", "fixtures", "speech", "whisper_goldens.json")


def int_list(text):
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive numbers")
    return out


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def wavs(clips_dir):
    out = []
    for d, _, names in os.walk(clips_dir):
        out += [os.path.join(d, n) for n in names if n.endswith(".wav")]
    return sorted(out)


def multilingual(directory):
    """Whisper's rule: a vocabulary of 51,865 tokens or more."""
    with open(os.path.join(directory, "vocabulary.txt"), encoding="utf-8") as f:
        vocab = f.read().split("\n")
    if vocab[-1] == "":
        vocab.pop()
    return len(vocab) >= 51865


def advance(tokens, seek, size, T, out):
    """One window's tokens, decoded from `seek` with `size` frames of audio:
    appends its segments (start, end, tokens) to `out`, returns the next seek
    (make_goldens.py's SEEK_RULE)."""
    offset = seek * g.HOP / g.SAMPLE_RATE
    single_ending = len(tokens) >= 2 and tokens[-2] < T <= tokens[-1]
    consecutive = [i for i in range(1, len(tokens)) if tokens[i] >= T and tokens[i - 1] >= T]
    if consecutive:
        slices = consecutive + ([len(tokens)] if single_ending else [])
        last = 0
        for cut in slices:
            seg = tokens[last:cut]
            out.append((offset + (seg[0] - T) * g.TIME_PRECISION,
                        offset + (seg[-1] - T) * g.TIME_PRECISION, seg))
            last = cut
        if single_ending:
            return seek + size
        return seek + (tokens[last - 1] - T) * g.INPUT_STRIDE
    duration = size * g.HOP / g.SAMPLE_RATE
    stamps = [t for t in tokens if t >= T]
    if stamps and stamps[-1] != T:
        duration = (stamps[-1] - T) * g.TIME_PRECISION
    out.append((offset, offset + duration, tokens))
    return seek + size


def transcribe(m, files, batch):
    """Transcribes `files` (float64 samples), windows of up to `batch` files
    per round. Returns (texts, window tokens per file, windows, mel seconds)."""
    T = m.special["timestamp_begin"]
    frames = [f.size // g.HOP for f in files]
    seek = [0] * len(files)
    segments = [[] for _ in files]
    tokens_of = [[] for _ in files]
    open_ = [i for i, n in enumerate(frames) if n > 0]
    windows, mel_s = 0, 0.0
    while open_:
        round_ = open_[:batch]
        t = time.perf_counter()
        mels = np.stack([g.log_mel(files[i][seek[i] * g.HOP:seek[i] * g.HOP + g.N_SAMPLES])
                         for i in round_])
        mel_s += time.perf_counter() - t
        enc = m.ct2.encode(ctranslate2.StorageView.from_array(mels), to_cpu=True)
        results = m.ct2.generate(enc, [m.prompt_timestamps] * len(round_), **g.GENERATE_OPTIONS)
        for i, r in zip(round_, results):
            tokens = list(r.sequences_ids[0])
            tokens_of[i].append(tokens)
            windows += 1
            size = min(g.N_FRAMES, frames[i] - seek[i])
            nxt = advance(tokens, seek[i], size, T, segments[i])
            # Never stall on a window (the rule makes this unreachable).
            seek[i] = nxt if nxt > seek[i] else seek[i] + size
        open_ = [i for i in open_ if seek[i] < frames[i]]
    texts = []
    for segs in segments:
        parts = [m.text(seg) for start, end, seg in segs if start != end]
        texts.append("".join(p for p in parts if p.strip()).strip())
    return texts, tokens_of, windows, mel_s


def main():
    ap = argparse.ArgumentParser(
        description="CTranslate2 Whisper over the speech clips, window by window with "
                    "segment timestamps: audio seconds per second at several window batch "
                    "sizes, compute types and thread counts (the reference side of "
                    "bench_speech). Prints one line per setting, and the encoder's time "
                    "per window on a batch of zeros.")
    ap.add_argument("--model", default="tiny.en", choices=sorted(MODEL_ENV),
                    help="the model, from deploy/speech_assets.sh's exports (default tiny.en)")
    ap.add_argument("--model-dir", help="a CTranslate2 Whisper folder instead of --model's")
    ap.add_argument("--clips", default=os.environ.get("MINIONS_SPEECH_CLIPS"),
                    help="folder of .wav files, all of them read (default $MINIONS_SPEECH_CLIPS)")
    ap.add_argument("--compute-types", default="float32,int8",
                    help="CTranslate2 compute types to try on the CPU (default float32,int8)")
    ap.add_argument("--batches", type=int_list, default=[1, 4, 8],
                    help="windows per batch to try (default 1,4,8)")
    ap.add_argument("--threads", type=int_list, default=[cores()],
                    help="intra_threads values to try (default: this machine's cores, %d)"
                    % cores())
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs per setting, the best kept (default 2)")
    ap.add_argument("--check", action="store_true",
                    help="also count the files whose window tokens equal "
                         "tests/fixtures/speech/whisper_goldens.json's (fp32, batch 1, 2 threads)")
    a = ap.parse_args()

    directory = a.model_dir or os.environ.get(MODEL_ENV[a.model])
    if not directory or not a.clips:
        ap.error("no model or clips folder: source deploy/speech_assets.sh, or pass "
                 "--model-dir and --clips")
    paths = wavs(a.clips)
    if not paths:
        ap.error("no .wav under %s" % a.clips)
    files = [g.read_wav(p) for p in paths]
    seconds = sum(f.size for f in files) / g.SAMPLE_RATE
    names = [os.path.relpath(p, a.clips) for p in paths]
    golden = None
    if a.check:
        with open(GOLDENS) as f:
            clips = json.load(f)["models"][a.model]["clips"]
        golden = [[w["tokens"] for w in clips[n]["timestamps"]["windows"]] if n in clips else None
                  for n in names]

    # Tokens, prompts and text as make_goldens.py makes them; its own fp32
    # model is replaced by each setting's.
    m = g.Model(a.model, directory, multilingual(directory))
    print("speech_reference: %s, %d files, %.1f s of audio, ctranslate2 %s, numpy %s, "
          "%d cores" % (a.model, len(files), seconds, ctranslate2.__version__,
                        np.__version__, cores()), file=sys.stderr, flush=True)

    for ct in [c.strip() for c in a.compute_types.split(",") if c.strip()]:
        for threads in a.threads:
            m.ct2 = None
            m.ct2 = ctranslate2.models.Whisper(directory, device="cpu", compute_type=ct,
                                               intra_threads=threads, inter_threads=1)
            tag = "ct2 %s threads %d" % (ct, threads)
            for b in a.batches:
                zeros = np.zeros((b, m.ct2.n_mels, g.N_FRAMES), dtype=np.float32)
                t = time.perf_counter()
                m.ct2.encode(ctranslate2.StorageView.from_array(zeros), to_cpu=True)
                print("%s encoder: batch %d: %.3f s a window"
                      % (tag, b, (time.perf_counter() - t) / b), file=sys.stderr, flush=True)
            for b in a.batches:
                best, best_mel, windows, tokens = float("inf"), 0.0, 0, None
                for _ in range(max(1, a.rounds)):
                    t = time.perf_counter()
                    _, tokens, windows, mel_s = transcribe(m, files, b)
                    took = time.perf_counter() - t
                    if took < best:
                        best, best_mel = took, mel_s
                check = ""
                if golden is not None:
                    same = sum(1 for x, y in zip(tokens, golden) if x == y)
                    check = ", %d of %d files with the goldens' tokens" % (same, len(files))
                print("%s batch %d: %.1f s of audio in %.2f s = %.1f audio s/s (%d windows, "
                      "%.3f s a window, mel %.0f%% of the time%s)"
                      % (tag, b, seconds, best, seconds / best, windows,
                         best / max(windows, 1), 100 * best_mel / best, check), flush=True)


if __name__ == "__main__":
    sys.exit(main())

//! Whisper's log-mel front end, computed as openai-whisper and
//! faster-whisper compute it, for 16 kHz mono samples (see [`super::audio`]).
//!
//! Both share one pipeline: a centred STFT (the signal reflect-padded by
//! [`N_FFT`]` / 2` = 200 samples on both sides, a periodic Hann window of
//! [`N_FFT`] = 400 samples, a hop of [`HOP_LENGTH`] = 160), the power
//! spectrum `|rfft|²` of 201 bins, the last STFT frame dropped, a Slaney
//! mel filter bank (librosa's `mel(sr=16000, n_fft=400, n_mels, fmin=0,
//! fmax=8000, htk=False, norm="slaney")`), then `log10(max(x, 1e-10))`,
//! then `max(x, m − 8)` where `m` is the largest value over everything
//! computed at once, then `(x + 4) / 4`.
//!
//! They differ in what is computed at once, and this module offers both:
//! - [`MelFrontEnd::window`] — one 30-s window: the samples zero-padded or
//!   trimmed to [`N_SAMPLES`] (480,000) first, [`N_FRAMES`] (3000) frames
//!   out, the clamp over those frames only (`log_mel_spectrogram(
//!   pad_or_trim(audio))`, as openai-whisper's examples do).
//! - [`MelFrontEnd::full`] — the whole file, as faster-whisper 1.2's
//!   `FeatureExtractor.__call__` (its default `padding=160`) and
//!   `WhisperModel.generate_segments` do: 160 zero samples are appended to
//!   the `n` samples, the STFT gives `n / 160 + 1` frames after the last is
//!   dropped, the clamp runs over all of them, and the first
//!   [`content_frames`]`(n) = n / 160` are the file's content (faster-whisper's
//!   `content_frames = features.shape[-1] - 1`). [`LogMel::window_at`]
//!   then takes the encoder's input at a seek offset as faster-whisper
//!   does: frames `seek .. seek + min(3000, content_frames − seek)`,
//!   followed by zeros up to 3000 frames (`pad_or_trim` on the already
//!   normalised features, so the padding is 0.0, not the log of silence).
//!   openai-whisper's `transcribe` computes the content frames identically
//!   (it appends 30 s of zeros instead of 160 samples, which no content
//!   frame reaches) and pads its segments with zeros the same way; only its
//!   clamp also sees a few more frames of the tail, which matters only when
//!   they are louder than the rest of the file.
//!
//! The filter bank is computed here at construction (in f64, stored as
//! f32, as librosa and faster-whisper do); the STFT is f32 with a cached
//! FFT plan, frames are split across rayon's pool, and each task reuses its
//! buffers for all its frames.

use std::sync::Arc;

use rayon::prelude::*;
use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

/// The sample rate Whisper's front end expects, in Hz.
pub const SAMPLE_RATE: usize = 16_000;
/// The STFT's FFT length (and Hann window length), in samples.
pub const N_FFT: usize = 400;
/// Samples between successive STFT frames (10 ms at 16 kHz).
pub const HOP_LENGTH: usize = 160;
/// Samples in one 30-s window.
pub const N_SAMPLES: usize = 30 * SAMPLE_RATE;
/// Frames in one 30-s window: the encoder's input width.
pub const N_FRAMES: usize = N_SAMPLES / HOP_LENGTH;
/// Bins of the one-sided power spectrum of an [`N_FFT`]-point FFT.
pub const N_BINS: usize = N_FFT / 2 + 1;
/// The most mel bands [`MelFrontEnd::new`] accepts (Whisper uses 80, and
/// 128 from large-v3 on; more than 201 bins can resolve is meaningless).
pub const MAX_MELS: usize = N_BINS;

/// Frames per rayon task in a 30-s window: enough to amortise a task's
/// buffers, few enough that a window spreads over many cores.
const FRAMES_PER_TASK: usize = 64;
/// Frames per rayon task in a whole file longer than two minutes: fewer
/// tasks, so fewer row slices to hand out (a 4-hour file: 2,800 tasks).
const FRAMES_PER_LONG_TASK: usize = 512;

/// Why a [`MelFrontEnd`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MelError {
    /// The model asks for a number of mel bands this front end does not
    /// compute (0, or more than [`MAX_MELS`]).
    #[error(
        "unsupported number of mel bands: {0} (expected 1..={MAX_MELS}; Whisper uses 80 or 128)"
    )]
    UnsupportedMels(usize),
}

/// The number of STFT frames that cover `n_samples` of audio, as Whisper
/// counts them for seeking: `n_samples / 160`, rounded down
/// (faster-whisper's and openai-whisper's `content_frames`).
pub fn content_frames(n_samples: usize) -> usize {
    n_samples / HOP_LENGTH
}

/// Whisper's log-mel front end for one number of mel bands: the filter
/// bank, the Hann window and the FFT plan, built once and shared by every
/// call (it is `Send + Sync`; calls may run at once).
pub struct MelFrontEnd {
    n_mels: usize,
    /// `n_mels × N_BINS`, row-major: the Slaney filter bank.
    filters: Vec<f32>,
    /// Per mel band, the range of bins where its filter is non-zero (the
    /// product skips the rest; a band with no non-zero bin has an empty
    /// range).
    spans: Vec<(usize, usize)>,
    /// The periodic Hann window of [`N_FFT`] samples.
    window: Vec<f32>,
    fft: Arc<dyn RealToComplex<f32>>,
}

impl std::fmt::Debug for MelFrontEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MelFrontEnd")
            .field("n_mels", &self.n_mels)
            .finish_non_exhaustive()
    }
}

/// A whole file's normalised log-mel spectrogram (see [`MelFrontEnd::full`]):
/// `n_mels` rows of `n_frames` content frames, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct LogMel {
    /// `n_mels × n_frames` values, row-major; empty when `n_frames` is 0.
    pub data: Vec<f32>,
    /// Rows: the mel bands.
    pub n_mels: usize,
    /// Columns: [`content_frames`] of the samples.
    pub n_frames: usize,
}

impl LogMel {
    /// The encoder's input at frame `seek`, `n_mels × 3000` row-major:
    /// frames `seek .. min(seek + 3000, n_frames)` then zeros, as
    /// faster-whisper's `pad_or_trim(features[:, seek:seek + segment_size])`.
    pub fn window_at(&self, seek: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.n_mels * N_FRAMES];
        self.window_into(seek, N_FRAMES, &mut out);
        out
    }

    /// Writes into `out` (`n_mels × 3000`, row-major) at most `len` frames
    /// from `seek` — fewer where the content ends — followed by zeros: the
    /// segment of faster-whisper's `segment_size = min(3000, content_frames
    /// − seek, clip_end − seek)` for a caller that clips (`len` =
    /// `clip_end − seek`). Returns the number of frames copied.
    ///
    /// # Panics
    /// If `out.len() != n_mels * 3000` (a caller's sizing bug).
    pub fn window_into(&self, seek: usize, len: usize, out: &mut [f32]) -> usize {
        assert_eq!(out.len(), self.n_mels * N_FRAMES, "window buffer size");
        let take = len.min(N_FRAMES).min(self.n_frames.saturating_sub(seek));
        for (m, row) in out.chunks_exact_mut(N_FRAMES).enumerate() {
            let src = &self.data[m * self.n_frames..(m + 1) * self.n_frames];
            row[..take].copy_from_slice(&src[seek.min(self.n_frames)..][..take]);
            row[take..].fill(0.0);
        }
        take
    }
}

/// A signal as the STFT sees it before reflect padding: `samples` followed
/// by zeros up to `len` samples (`len >= samples.len()`).
#[derive(Clone, Copy)]
struct Signal<'a> {
    samples: &'a [f32],
    len: usize,
}

impl Signal<'_> {
    /// Sample `j` of the centred, reflect-padded signal, where `j` counts
    /// from the signal's start (negative or past the end in the padding).
    /// Reflection repeats for padding longer than the signal, as numpy's
    /// `np.pad(mode="reflect")` does.
    #[inline]
    fn at(&self, j: isize) -> f32 {
        let len = self.len as isize;
        let i = if (0..len).contains(&j) {
            j
        } else if len <= 1 {
            0
        } else {
            let period = 2 * (len - 1);
            let m = j.rem_euclid(period);
            if m < len { m } else { period - m }
        };
        // `i` is in 0..len here.
        self.samples.get(i as usize).copied().unwrap_or(0.0)
    }
}

/// One rayon task's buffers, reused for each of its frames.
struct Scratch {
    frame: Vec<f32>,
    spectrum: Vec<Complex<f32>>,
    fft: Vec<Complex<f32>>,
    power: Vec<f32>,
    mel: Vec<f32>,
}

impl MelFrontEnd {
    /// The front end for `n_mels` bands (80 for Whisper up to large-v2,
    /// 128 for large-v3): builds the filter bank, the window and the FFT
    /// plan.
    pub fn new(n_mels: usize) -> Result<Self, MelError> {
        if n_mels == 0 || n_mels > MAX_MELS {
            return Err(MelError::UnsupportedMels(n_mels));
        }
        let filters = mel_filters(n_mels);
        let spans = filters
            .chunks_exact(N_BINS)
            .map(|row| {
                let start = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let end = row.iter().rposition(|&w| w != 0.0).map_or(0, |e| e + 1);
                (start, end.max(start))
            })
            .collect();
        let window = (0..N_FFT)
            .map(|n| {
                let x = 2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64;
                (0.5 - 0.5 * x.cos()) as f32
            })
            .collect();
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
        Ok(Self {
            n_mels,
            filters,
            spans,
            window,
            fft,
        })
    }

    /// The number of mel bands (rows of every output).
    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// The filter bank, `n_mels × 201` row-major: row `m` weights the power
    /// spectrum's bins (bin `k` is `k × 40` Hz) into band `m`.
    pub fn filters(&self) -> &[f32] {
        &self.filters
    }

    /// One 30-s window's normalised log-mel, `n_mels × 3000` row-major:
    /// `samples` zero-padded or trimmed to 480,000, the clamp to
    /// `max − 8` over these 3000 frames (openai-whisper's
    /// `log_mel_spectrogram(pad_or_trim(audio))`).
    pub fn window(&self, samples: &[f32]) -> Vec<f32> {
        let signal = Signal {
            samples: &samples[..samples.len().min(N_SAMPLES)],
            len: N_SAMPLES,
        };
        let mut out = vec![0.0; self.n_mels * N_FRAMES];
        let max = self.log_mel_into(signal, N_FRAMES, &mut out);
        normalise(&mut out, max);
        out
    }

    /// The whole file's normalised log-mel as faster-whisper computes it
    /// (see the module's doc): `samples` followed by 160 zeros, frames
    /// `0 ..= n / 160` in the clamp's maximum, frames `0 .. n / 160` kept.
    /// Holds `n_mels × n / 160` values: 115 MB per hour of audio at 80
    /// bands, 184 MB at 128.
    pub fn full(&self, samples: &[f32]) -> LogMel {
        let n_frames = content_frames(samples.len());
        let signal = Signal {
            samples,
            len: samples.len() + HOP_LENGTH,
        };
        let mut data = vec![0.0; self.n_mels * n_frames];
        let mut max = self.log_mel_into(signal, n_frames, &mut data);
        // The frame after the content: in faster-whisper's features (and
        // so in its maximum), not in its content.
        let mut scratch = self.scratch();
        self.frame_log_mel(signal, n_frames, &mut scratch);
        max = scratch.mel.iter().copied().fold(max, f32::max);
        normalise(&mut data, max);
        LogMel {
            data,
            n_mels: self.n_mels,
            n_frames,
        }
    }

    fn scratch(&self) -> Scratch {
        Scratch {
            frame: vec![0.0; N_FFT],
            spectrum: vec![Complex::default(); N_BINS],
            fft: vec![Complex::default(); self.fft.get_scratch_len()],
            power: vec![0.0; N_BINS],
            mel: vec![0.0; self.n_mels],
        }
    }

    /// Frames `0..n_frames` of `signal` as `log10(max(mel, 1e-10))` into
    /// `out` (`n_mels × n_frames`, row-major). Returns their maximum
    /// (`-10` when there are none).
    fn log_mel_into(&self, signal: Signal<'_>, n_frames: usize, out: &mut [f32]) -> f32 {
        debug_assert_eq!(out.len(), self.n_mels * n_frames);
        if n_frames == 0 {
            return -10.0;
        }
        let per_task = if n_frames > 4 * N_FRAMES {
            FRAMES_PER_LONG_TASK
        } else {
            FRAMES_PER_TASK
        };
        // Each task owns a block of frames: its slice of every row.
        let mut blocks: Vec<Vec<&mut [f32]>> = (0..n_frames.div_ceil(per_task))
            .map(|_| Vec::with_capacity(self.n_mels))
            .collect();
        for row in out.chunks_exact_mut(n_frames) {
            for (block, part) in blocks.iter_mut().zip(row.chunks_mut(per_task)) {
                block.push(part);
            }
        }
        blocks
            .into_par_iter()
            .enumerate()
            .map_init(
                || self.scratch(),
                |scratch, (b, mut rows)| {
                    let first = b * per_task;
                    let count = rows.first().map_or(0, |r| r.len());
                    let mut max = f32::NEG_INFINITY;
                    for f in 0..count {
                        self.frame_log_mel(signal, first + f, scratch);
                        for (row, &v) in rows.iter_mut().zip(&scratch.mel) {
                            row[f] = v;
                            max = max.max(v);
                        }
                    }
                    max
                },
            )
            .reduce(|| f32::NEG_INFINITY, f32::max)
    }

    /// Frame `t` of `signal` as `log10(max(mel, 1e-10))` into
    /// `scratch.mel`.
    fn frame_log_mel(&self, signal: Signal<'_>, t: usize, scratch: &mut Scratch) {
        let start = (t * HOP_LENGTH) as isize - (N_FFT / 2) as isize;
        let inside = start >= 0 && start as usize + N_FFT <= signal.samples.len();
        if inside {
            let src = &signal.samples[start as usize..start as usize + N_FFT];
            for ((d, &s), &w) in scratch.frame.iter_mut().zip(src).zip(&self.window) {
                *d = s * w;
            }
        } else {
            for (i, (d, &w)) in scratch.frame.iter_mut().zip(&self.window).enumerate() {
                *d = signal.at(start + i as isize) * w;
            }
        }
        // The lengths are this plan's own, so the FFT cannot refuse them;
        // were it to, the frame would read as silence rather than panic.
        if self
            .fft
            .process_with_scratch(&mut scratch.frame, &mut scratch.spectrum, &mut scratch.fft)
            .is_err()
        {
            scratch.spectrum.fill(Complex::default());
        }
        for (p, c) in scratch.power.iter_mut().zip(&scratch.spectrum) {
            *p = c.re * c.re + c.im * c.im;
        }
        for ((mel, row), &(lo, hi)) in scratch
            .mel
            .iter_mut()
            .zip(self.filters.chunks_exact(N_BINS))
            .zip(&self.spans)
        {
            let e: f32 = row[lo..hi]
                .iter()
                .zip(&scratch.power[lo..hi])
                .map(|(w, p)| w * p)
                .sum();
            *mel = e.max(1e-10).log10();
        }
    }
}

/// `x = (max(x, max − 8) + 4) / 4` over `values`.
fn normalise(values: &mut [f32], max: f32) {
    let floor = max - 8.0;
    values
        .par_chunks_mut(1 << 16)
        .for_each(|c| c.iter_mut().for_each(|v| *v = (v.max(floor) + 4.0) / 4.0));
}

/// Hz to mels on librosa's Slaney scale (`htk=False`): linear below 1 kHz
/// (200/3 Hz per mel), logarithmic above (27 mels per factor 6.4).
fn hz_to_mel(hz: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if hz >= min_log_hz {
        min_log_mel + (hz / min_log_hz).ln() / logstep
    } else {
        hz / f_sp
    }
}

/// The inverse of [`hz_to_mel`].
fn mel_to_hz(mel: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel {
        min_log_hz * (logstep * (mel - min_log_mel)).exp()
    } else {
        f_sp * mel
    }
}

/// librosa's `filters.mel(sr=16000, n_fft=400, n_mels, fmin=0, fmax=8000,
/// htk=False, norm="slaney")`, computed in f64 and stored as f32:
/// `n_mels × 201`, row-major.
fn mel_filters(n_mels: usize) -> Vec<f32> {
    let fft_freqs: Vec<f64> = (0..N_BINS)
        .map(|k| k as f64 * SAMPLE_RATE as f64 / N_FFT as f64)
        .collect();
    // `n_mels + 2` band edges evenly spaced in mels (numpy's linspace: the
    // last point exactly the maximum).
    let max_mel = hz_to_mel(SAMPLE_RATE as f64 / 2.0);
    let step = max_mel / (n_mels + 1) as f64;
    let edges: Vec<f64> = (0..n_mels + 2)
        .map(|i| {
            if i == n_mels + 1 {
                mel_to_hz(max_mel)
            } else {
                mel_to_hz(i as f64 * step)
            }
        })
        .collect();
    let mut out = Vec::with_capacity(n_mels * N_BINS);
    for m in 0..n_mels {
        let (lo, mid, hi) = (edges[m], edges[m + 1], edges[m + 2]);
        let enorm = 2.0 / (hi - lo);
        out.extend(fft_freqs.iter().map(|&f| {
            let lower = -(lo - f) / (mid - lo);
            let upper = (hi - f) / (hi - mid);
            (0f64.max(lower.min(upper)) * enorm) as f32
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// The synthetic test signal, as `make_mel_reference.py` generates it:
    /// a 440 Hz tone plus a 100 Hz → 7 kHz linear chirp, computed in f64
    /// then rounded to f32.
    fn test_signal(n: usize) -> Vec<f32> {
        use std::f64::consts::PI;
        let duration = 3.0;
        let (f0, f1) = (100.0, 7000.0);
        (0..n)
            .map(|i| {
                let t = i as f64 / SAMPLE_RATE as f64;
                let tone = 0.4 * (2.0 * PI * 440.0 * t).sin();
                let chirp =
                    0.3 * (2.0 * PI * (f0 * t + (f1 - f0) / (2.0 * duration) * t * t)).sin();
                (tone + chirp) as f32
            })
            .collect()
    }

    fn fixture() -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/speech/mel_reference.json"
        );
        Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
    }

    fn floats(v: &serde_json::Value) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        v.as_array()
            .ok_or("expected an array")?
            .iter()
            .map(|x| {
                x.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| "expected a number".into())
            })
            .collect()
    }

    fn indices(v: &serde_json::Value) -> Result<Vec<usize>, Box<dyn std::error::Error>> {
        v.as_array()
            .ok_or("expected an array")?
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| "expected an index".into())
            })
            .collect()
    }

    /// The largest difference between `got` (`n_mels × width`, row-major)
    /// at the case's frames and the case's values (`frames × n_mels`).
    fn case_diff(
        case: &serde_json::Value,
        got: &[f32],
        width: usize,
    ) -> Result<f32, Box<dyn std::error::Error>> {
        let frames = indices(&case["frames"])?;
        let want = floats(&case["values"])?;
        let n_mels = case["n_mels"].as_u64().ok_or("n_mels")? as usize;
        assert_eq!(want.len(), frames.len() * n_mels);
        let mut worst = 0f32;
        for (i, &t) in frames.iter().enumerate() {
            for m in 0..n_mels {
                worst = worst.max((got[m * width + t] - want[i * n_mels + m]).abs());
            }
        }
        Ok(worst)
    }

    /// The filter bank matches librosa's (computed by numpy in the
    /// fixture script): each band's sum and its peak bin.
    #[test]
    fn filters_match_librosa() -> TestResult {
        let fixture = fixture()?;
        for n_mels in [80usize, 128] {
            let mel = MelFrontEnd::new(n_mels)?;
            let want = floats(&fixture[format!("filter_row_sums_{n_mels}")])?;
            let peaks = indices(&fixture[format!("filter_row_argmax_{n_mels}")])?;
            assert_eq!(want.len(), n_mels);
            for (m, row) in mel.filters().chunks_exact(N_BINS).enumerate() {
                let sum: f32 = row.iter().sum();
                assert!(
                    (sum - want[m]).abs() <= 1e-6 * want[m].abs().max(1.0),
                    "band {m}: {sum} vs {}",
                    want[m]
                );
                let argmax = row
                    .iter()
                    .enumerate()
                    .fold((0, f32::MIN), |b, (k, &w)| if w > b.1 { (k, w) } else { b })
                    .0;
                assert_eq!(argmax, peaks[m], "band {m}");
            }
        }
        Ok(())
    }

    /// The 30-s window and the whole-file spectrogram match numpy's (f64)
    /// reference on the synthetic signal to 1e-4.
    #[test]
    fn log_mel_matches_numpy_reference() -> TestResult {
        let fixture = fixture()?;
        let n = fixture["n_samples"].as_u64().ok_or("n_samples")? as usize;
        let samples = test_signal(n);
        let mut worst = 0f32;
        for case in fixture["cases"].as_array().ok_or("cases")? {
            let n_mels = case["n_mels"].as_u64().ok_or("n_mels")? as usize;
            let mel = MelFrontEnd::new(n_mels)?;
            let diff = match case["kind"].as_str() {
                Some("window") => case_diff(case, &mel.window(&samples), N_FRAMES)?,
                Some("full") => {
                    let full = mel.full(&samples);
                    assert_eq!(
                        full.n_frames,
                        case["n_frames"].as_u64().ok_or("n_frames")? as usize
                    );
                    case_diff(case, &full.data, full.n_frames)?
                }
                other => return Err(format!("unknown case kind {other:?}").into()),
            };
            assert!(
                diff <= 1e-4,
                "{} ({n_mels} mels): max diff {diff}",
                case["kind"]
            );
            worst = worst.max(diff);
        }
        eprintln!("log-mel vs numpy: max abs diff {worst:e}");
        Ok(())
    }

    #[test]
    fn content_frames_rounds_down() {
        assert_eq!(content_frames(0), 0);
        assert_eq!(content_frames(159), 0);
        assert_eq!(content_frames(160), 1);
        assert_eq!(content_frames(480_000), 3000);
        assert_eq!(content_frames(480_159), 3000);
    }

    #[test]
    fn rejects_unsupported_band_counts() {
        assert_eq!(
            MelFrontEnd::new(0).err(),
            Some(MelError::UnsupportedMels(0))
        );
        assert_eq!(
            MelFrontEnd::new(202).err(),
            Some(MelError::UnsupportedMels(202))
        );
    }

    /// Windows slice the whole file's spectrogram and pad with zeros; a
    /// file shorter than one frame (or empty) gives no frames, not a panic.
    #[test]
    fn windows_slice_and_pad() -> TestResult {
        let mel = MelFrontEnd::new(80)?;
        let samples = test_signal(16_000 * 3 + 77);
        let full = mel.full(&samples);
        assert_eq!(full.n_frames, 300);
        let w = full.window_at(100);
        for m in [0, 40, 79] {
            assert_eq!(
                &w[m * N_FRAMES..m * N_FRAMES + 200],
                &full.data[m * 300 + 100..m * 300 + 300]
            );
            assert!(
                w[m * N_FRAMES + 200..(m + 1) * N_FRAMES]
                    .iter()
                    .all(|&v| v == 0.0)
            );
        }
        let mut out = vec![1.0; 80 * N_FRAMES];
        assert_eq!(full.window_into(290, 5, &mut out), 5);
        assert!(out[5..N_FRAMES].iter().all(|&v| v == 0.0));
        assert_eq!(full.window_into(400, 3000, &mut out), 0);
        assert!(out.iter().all(|&v| v == 0.0));
        for n in [0, 1, 30, 159, 160, 250] {
            let tiny = mel.full(&samples[..n]);
            assert_eq!(tiny.n_frames, n / 160);
            assert!(tiny.data.iter().all(|v| v.is_finite()));
            assert_eq!(tiny.window_at(0).len(), 80 * N_FRAMES);
        }
        let silent = mel.window(&[]);
        assert!(silent.iter().all(|&v| v == (-10.0 + 4.0) / 4.0));
        Ok(())
    }

    /// A window of a file longer than 30 s is the window of its first 30 s;
    /// for a file that fills one window, the window's frames are the whole
    /// file's content frames (their clamps see the same maximum here) but
    /// for the last, which reflects the audio where the whole file's sees
    /// its 160 zeros.
    #[test]
    fn window_trims_long_input() -> TestResult {
        let mel = MelFrontEnd::new(80)?;
        let mut samples = test_signal(N_SAMPLES);
        let trimmed = mel.window(&samples);
        let full = mel.full(&samples);
        assert_eq!(full.n_frames, N_FRAMES);
        let windowed = full.window_at(0);
        let worst = trimmed
            .chunks_exact(N_FRAMES)
            .zip(windowed.chunks_exact(N_FRAMES))
            .flat_map(|(a, b)| a[..N_FRAMES - 1].iter().zip(&b[..N_FRAMES - 1]))
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-6, "window vs whole file: {worst}");
        samples.extend(test_signal(1000));
        assert_eq!(mel.window(&samples), trimmed);
        Ok(())
    }
}

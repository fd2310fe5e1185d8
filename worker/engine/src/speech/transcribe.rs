//! Files transcribed window by window, windows of several files batched.
//!
//! A file's next 30-second window starts at its `seek` (in mel frames, 100
//! per second); its log-mel is computed from the 480,000 samples there
//! (zero-padded at the file's end) and normalised over that window alone,
//! so memory stays one window per file whatever the file's length, and a
//! file resumed at a window's start gives the same windows. (faster-whisper
//! computes one log-mel over the whole file and slices it; the two differ
//! only in the normalisation's maximum and at window edges.)
//! Every round takes the next window of up to `batch` unfinished files,
//! runs them through the encoder as one batch and decodes them together;
//! each file's seek then moves as Whisper's transcription loop moves it:
//! - with timestamps, the window's tokens are cut into segments at each
//!   pair of adjacent timestamps; when the window ends on a single
//!   timestamp, the whole window was used and seek moves past it; otherwise
//!   seek moves to the last closing timestamp, and speech after it runs
//!   again in the next window;
//! - without pairs, the window is one segment (ending at its last
//!   timestamp, if any) and seek moves past the window;
//! - without timestamps, every window is one segment and seek moves past it.
//!
//! Windows are not conditioned on the text of the ones before (faster-
//! whisper's `condition_on_previous_text=False`): a window's tokens then
//! depend on its audio alone (and, for a file's first window, the initial
//! prompt), so batching across files and resuming a file from a finished
//! window give the same text as one file run alone.
//!
//! With more than one temperature, Whisper's fallback applies: a window
//! whose text compresses more than 2.4 times (zlib, level 6: repetition)
//! or whose log-probability per token is under −1 is decoded again at the
//! next temperature (sampling, best of 5, seeded from the window's mel so
//! that a rerun draws the same); where every temperature fails, the
//! attempt with the best log-probability among those under the
//! compression limit is kept. A window whose `<|nospeech|>` probability is
//! above 0.6 and whose log-probability per token is at most −1 is silence:
//! it is not retried and gives no segment.

use std::io::Write;

use candle_core::Tensor;

use super::decode::{
    DecodeExtras, Decoded, Specials, Strategy, TIME_PRECISION, decode, detect_language,
};
use super::mel::{HOP_LENGTH, MelFrontEnd, N_SAMPLES, content_frames};
use super::whisper::Whisper;
use crate::ModelError;

/// Whisper's limit on a window's text compression ratio.
pub const COMPRESSION_RATIO_THRESHOLD: f64 = 2.4;
/// Whisper's limit on a window's log-probability per token.
pub const LOGPROB_THRESHOLD: f64 = -1.0;
/// Whisper's `<|nospeech|>` probability above which a window may be silence.
pub const NO_SPEECH_THRESHOLD: f32 = 0.6;
/// Samples per window at a temperature above 0 (Whisper's `best_of`).
pub const BEST_OF: usize = 5;

/// The parts a transcription uses: the network, its special tokens, the
/// front end, and tokens to text (for the fallback's compression ratio).
#[derive(Clone, Copy)]
pub struct Parts<'a> {
    /// The network.
    pub model: &'a Whisper,
    /// Its special tokens.
    pub specials: &'a Specials,
    /// The log-mel front end.
    pub mel: &'a MelFrontEnd,
    /// Tokens to text (special tokens and timestamps left out).
    pub text: &'a dyn Fn(&[u32]) -> String,
}

/// Mel frames per second (hop of 160 samples at 16 kHz).
pub const FRAMES_PER_SECOND: usize = 100;
/// Mel frames per window.
pub const WINDOW_FRAMES: usize = 3000;
/// Mel frames per encoder position (the second convolution's stride).
const FRAMES_PER_POSITION: usize = 2;

/// What to transcribe and how.
#[derive(Clone, Debug, PartialEq)]
pub struct TranscribeOptions {
    /// The spoken language's token (multilingual models); detected per
    /// file from its first window when `None`.
    pub language: Option<u32>,
    /// Translate to English instead of transcribing.
    pub translate: bool,
    /// Segment timestamps (otherwise one segment per window).
    pub timestamps: bool,
    /// Windows per encoder batch (and decoder rows per pass: a beam
    /// search or sampling runs fewer windows at once).
    pub batch: usize,
    /// Beams at temperature 0 (1: greedy).
    pub beam: usize,
    /// Temperatures tried in turn; more than one: Whisper's fallback (see
    /// the module's comment). `[0.0]`: plain decoding, every window kept.
    pub temperatures: Vec<f32>,
    /// Tokens of the initial prompt, given to each file's first window
    /// (empty: none).
    pub prompt: Vec<u32>,
}

impl Default for TranscribeOptions {
    /// Greedy, timestamps on, the language detected, batches of
    /// [`super::SHARD_BATCH`].
    fn default() -> Self {
        Self {
            language: None,
            translate: false,
            timestamps: true,
            batch: super::SHARD_BATCH,
            beam: 1,
            temperatures: vec![0.0],
            prompt: Vec::new(),
        }
    }
}

/// A span of a transcript.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    /// Start, seconds from the file's start.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// The segment's tokens, timestamps included.
    pub tokens: Vec<u32>,
}

/// A file's transcript, as tokens; [`super::SpeechModel`] turns it into text.
#[derive(Clone, Debug, PartialEq)]
pub struct Transcript {
    /// The language token used (multilingual models).
    pub language: Option<u32>,
    /// Segments in order.
    pub segments: Vec<Segment>,
    /// Windows decoded.
    pub windows: usize,
}

/// A file on its way through: the windows before `seek` are done. A file
/// resumed from one gives what running on would have given (windows are
/// not conditioned on earlier text).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Partial {
    /// Where the next window starts, in mel frames.
    pub seek: usize,
    /// The language token in use.
    pub language: Option<u32>,
    /// Segments so far.
    pub segments: Vec<Segment>,
    /// Windows decoded so far.
    pub windows: usize,
}

/// What [`transcribe_from`] reports, with the file's index.
#[derive(Debug)]
pub enum Event<'a> {
    /// A window of an unfinished file is done: where it stands now.
    Window(&'a Partial),
    /// The file is done.
    Done(Transcript),
}

/// Transcribes `files` (16 kHz mono samples), handing each finished one to
/// `done` with its index; stops between rounds when `stop()` says so
/// (files not finished are not reported).
pub fn transcribe(
    parts: Parts<'_>,
    files: &[&[f32]],
    opts: &TranscribeOptions,
    stop: &dyn Fn() -> bool,
    done: &mut dyn FnMut(usize, Transcript),
) -> Result<(), ModelError> {
    let starts = vec![Partial::default(); files.len()];
    transcribe_from(parts, files, starts, opts, stop, &mut |i, e| {
        if let Event::Done(t) = e {
            done(i, t);
        }
    })
}

/// Transcribes `files`, each from where `starts` says (one per file; a
/// default [`Partial`] starts at the beginning), reporting every window
/// of an unfinished file and every finished file to `events`; stops between
/// rounds when `stop()` says so.
pub fn transcribe_from(
    parts: Parts<'_>,
    files: &[&[f32]],
    starts: Vec<Partial>,
    opts: &TranscribeOptions,
    stop: &dyn Fn() -> bool,
    events: &mut dyn FnMut(usize, Event<'_>),
) -> Result<(), ModelError> {
    let (model, sp, mel) = (parts.model, parts.specials, parts.mel);
    let n_mels = model.dims().n_mels;
    if mel.n_mels() != n_mels {
        return Err(ModelError::BadInput(format!(
            "a front end of {} mel bins for a model of {n_mels}",
            mel.n_mels()
        )));
    }
    if starts.len() != files.len() {
        return Err(ModelError::BadInput(format!(
            "{} starting points for {} files",
            starts.len(),
            files.len()
        )));
    }
    let frames: Vec<usize> = files.iter().map(|f| content_frames(f.len())).collect();
    let mut state: Vec<Partial> = starts
        .into_iter()
        .map(|mut p| {
            p.language = p.language.or(opts.language);
            p
        })
        .collect();
    // Files with nothing left (no audio at all) are done at once.
    let mut open: Vec<usize> = Vec::new();
    for (i, &f) in frames.iter().enumerate() {
        if state[i].seek >= f {
            events(i, Event::Done(finish(&mut state[i])));
        } else {
            open.push(i);
        }
    }
    let batch = opts.batch.max(1);
    while !open.is_empty() && !stop() {
        let round: Vec<usize> = open.iter().copied().take(batch).collect();
        let windows: Vec<f32> = round
            .iter()
            .flat_map(|&i| {
                let from = state[i].seek * HOP_LENGTH;
                let to = (from + N_SAMPLES).min(files[i].len());
                mel.window(&files[i][from.min(to)..to])
            })
            .collect();
        let per = n_mels * WINDOW_FRAMES;
        let seeds: Vec<u64> = windows.chunks(per).map(seed_of).collect();
        let windows = candle_core::Tensor::from_vec(
            windows,
            (round.len(), n_mels, WINDOW_FRAMES),
            model.device(),
        )?;
        let encoded = model.encode(&windows)?;
        if sp.multilingual() && round.iter().any(|&i| state[i].language.is_none()) {
            let langs = detect_language(model, model.start(&encoded)?, round.len(), sp)?;
            for (k, &i) in round.iter().enumerate() {
                state[i].language.get_or_insert(langs[k]);
            }
        }
        let prompts: Vec<Vec<u32>> = round
            .iter()
            .map(|&i| {
                let previous: &[u32] = if state[i].seek == 0 {
                    &opts.prompt
                } else {
                    &[]
                };
                sp.prompt_after(previous, state[i].language, opts.translate, opts.timestamps)
            })
            .collect();
        let chosen = decode_round(parts, &encoded, &prompts, &seeds, opts)?;
        for (k, &i) in round.iter().enumerate() {
            let p = &mut state[i];
            p.windows += 1;
            let size = WINDOW_FRAMES.min(frames[i] - p.seek);
            let next = match &chosen[k] {
                Chosen::Silence => p.seek + size,
                Chosen::Tokens(t) => advance(t, p.seek, size, sp, &mut p.segments),
            };
            // Never stall on a window (the rules make this unreachable).
            p.seek = if next > p.seek { next } else { p.seek + size };
        }
        open.retain(|&i| {
            if state[i].seek >= frames[i] {
                events(i, Event::Done(finish(&mut state[i])));
                false
            } else {
                if round.contains(&i) {
                    events(i, Event::Window(&state[i]));
                }
                true
            }
        });
    }
    Ok(())
}

/// What a window gave.
#[derive(Clone, Debug)]
enum Chosen {
    /// Its tokens.
    Tokens(Vec<u32>),
    /// Nothing: silence (fallback mode only).
    Silence,
}

/// Decodes one round's windows (`encoded`, one row per prompt): rows with
/// prompts of one length together, each as the options say.
fn decode_round(
    parts: Parts<'_>,
    encoded: &Tensor,
    prompts: &[Vec<u32>],
    seeds: &[u64],
    opts: &TranscribeOptions,
) -> Result<Vec<Chosen>, ModelError> {
    let mut lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    lens.sort_unstable();
    lens.dedup();
    let mut out: Vec<Option<Chosen>> = vec![None; prompts.len()];
    for len in lens {
        let rows: Vec<usize> = (0..prompts.len())
            .filter(|&k| prompts[k].len() == len)
            .collect();
        let got = with_fallback(parts, encoded, &rows, prompts, seeds, opts)?;
        for (&r, c) in rows.iter().zip(got) {
            out[r] = Some(c);
        }
    }
    Ok(out
        .into_iter()
        .map(|c| c.unwrap_or(Chosen::Silence))
        .collect())
}

/// The rows `rows` of `encoded` (all of it when `rows` is every row in
/// order).
fn select(encoded: &Tensor, rows: &[usize]) -> Result<Tensor, ModelError> {
    if rows.len() == encoded.dim(0)? && rows.iter().enumerate().all(|(i, &r)| i == r) {
        return Ok(encoded.clone());
    }
    let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    let idx = Tensor::from_vec(idx, rows.len(), encoded.device())?;
    Ok(encoded.index_select(&idx, 0)?)
}

/// Decodes windows `rows` (prompts of one length) at the options'
/// temperatures in turn, as the module's comment says.
fn with_fallback(
    parts: Parts<'_>,
    encoded: &Tensor,
    rows: &[usize],
    prompts: &[Vec<u32>],
    seeds: &[u64],
    opts: &TranscribeOptions,
) -> Result<Vec<Chosen>, ModelError> {
    let fallback = opts.temperatures.len() > 1;
    let mut attempts: Vec<Vec<(Decoded, f64)>> = vec![Vec::new(); rows.len()];
    let mut no_speech: Vec<Option<f32>> = vec![None; rows.len()];
    // Indices into `rows` still to decode.
    let mut pending: Vec<usize> = (0..rows.len()).collect();
    let temperatures: &[f32] = if opts.temperatures.is_empty() {
        &[0.0]
    } else {
        &opts.temperatures
    };
    for (round, &t) in temperatures.iter().enumerate() {
        if pending.is_empty() {
            break;
        }
        let strategy = if t > 0.0 {
            Strategy::Sample {
                temperature: t,
                best_of: BEST_OF,
            }
        } else if opts.beam > 1 {
            Strategy::Beam(opts.beam)
        } else {
            Strategy::Greedy
        };
        let at_once = (opts.batch.max(1) / strategy.rows_per_window()).max(1);
        let mut failed = Vec::new();
        for part in pending.chunks(at_once) {
            let sel: Vec<usize> = part.iter().map(|&j| rows[j]).collect();
            let enc = select(encoded, &sel)?;
            let ps: Vec<Vec<u32>> = sel.iter().map(|&r| prompts[r].clone()).collect();
            let extras = DecodeExtras {
                scores: fallback,
                no_speech: fallback && round == 0,
                seeds: sel
                    .iter()
                    .map(|&r| seeds[r] ^ (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    .collect(),
            };
            let got = decode(
                parts.model,
                parts.model.start(&enc)?,
                &ps,
                parts.specials,
                strategy,
                &extras,
            )?;
            for (&j, d) in part.iter().zip(got) {
                if d.no_speech.is_some() {
                    no_speech[j] = d.no_speech;
                }
                if !fallback {
                    attempts[j].push((d, 0.0));
                    continue;
                }
                let ratio = compression_ratio(&(parts.text)(&d.tokens));
                let retry = needs_retry(ratio, d.avg_logprob(), no_speech[j]);
                attempts[j].push((d, ratio));
                if retry {
                    failed.push(j);
                }
            }
        }
        pending = failed;
    }
    Ok(attempts
        .into_iter()
        .enumerate()
        .map(|(j, mut tried)| {
            let scores: Vec<(f64, f64)> =
                tried.iter().map(|(d, r)| (d.avg_logprob(), *r)).collect();
            let pick = pick_attempt(&scores, pending.contains(&j));
            if pick >= tried.len() {
                return Chosen::Silence;
            }
            let d = tried.swap_remove(pick).0;
            if fallback && is_silence(no_speech[j], d.avg_logprob()) {
                Chosen::Silence
            } else {
                Chosen::Tokens(d.tokens)
            }
        })
        .collect())
}

/// Whether a window decoded with log-probability per token `avg`, text
/// compression `ratio` and `<|nospeech|>` probability `no_speech` is tried
/// again at the next temperature: it repeats itself or is unlikely, and is
/// not silence.
fn needs_retry(ratio: f64, avg: f64, no_speech: Option<f32>) -> bool {
    let silent = no_speech.is_some_and(|p| p > NO_SPEECH_THRESHOLD);
    (ratio > COMPRESSION_RATIO_THRESHOLD || avg < LOGPROB_THRESHOLD)
        && !(silent && avg < LOGPROB_THRESHOLD)
}

/// Whether a window is silence: `<|nospeech|>` likely and the text not.
fn is_silence(no_speech: Option<f32>, avg: f64) -> bool {
    no_speech.is_some_and(|p| p > NO_SPEECH_THRESHOLD) && avg <= LOGPROB_THRESHOLD
}

/// Which of a window's attempts (`(avg_logprob, compression ratio)` each,
/// in temperature order) is kept: the last, unless every one failed
/// (`all_failed`); then the most likely among those that do not repeat
/// themselves, else among all (the first of equals).
fn pick_attempt(tried: &[(f64, f64)], all_failed: bool) -> usize {
    if !all_failed {
        return tried.len().saturating_sub(1);
    }
    let under: Vec<usize> = (0..tried.len())
        .filter(|&a| tried[a].1 <= COMPRESSION_RATIO_THRESHOLD)
        .collect();
    let among: Vec<usize> = if under.is_empty() {
        (0..tried.len()).collect()
    } else {
        under
    };
    let mut best = among.first().copied().unwrap_or(0);
    for &a in &among {
        if tried[a].0 > tried[best].0 {
            best = a;
        }
    }
    best
}

/// How much `text` compresses (zlib, level 6): Whisper's measure of
/// repetition. 0 for an empty text.
pub fn compression_ratio(text: &str) -> f64 {
    if text.is_empty() {
        return 0.0;
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
    // Writing to a vector cannot fail.
    let packed = z
        .write_all(text.as_bytes())
        .and_then(|()| z.finish())
        .map_or(text.len(), |v| v.len());
    text.len() as f64 / packed.max(1) as f64
}

/// A seed for a window's draws, from its mel (FNV-1a over the values'
/// bits): the same window draws the same, batched or alone, resumed or not.
fn seed_of(window: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in window {
        h ^= u64::from(v.to_bits());
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn finish(p: &mut Partial) -> Transcript {
    Transcript {
        language: p.language,
        segments: std::mem::take(&mut p.segments),
        windows: p.windows,
    }
}

/// Cuts one window's `tokens` (decoded from `seek`, `size` frames of audio)
/// into segments appended to `out`; returns the next seek.
fn advance(
    tokens: &[u32],
    seek: usize,
    size: usize,
    sp: &Specials,
    out: &mut Vec<Segment>,
) -> usize {
    let tb = sp.timestamp_begin;
    let is_ts = |t: u32| t >= tb;
    let offset = seek as f64 / FRAMES_PER_SECOND as f64;
    let at = |t: u32| offset + f64::from(t - tb) * TIME_PRECISION;
    let single_ending =
        tokens.len() >= 2 && !is_ts(tokens[tokens.len() - 2]) && is_ts(tokens[tokens.len() - 1]);
    let mut cuts: Vec<usize> = (1..tokens.len())
        .filter(|&i| is_ts(tokens[i]) && is_ts(tokens[i - 1]))
        .collect();
    if !cuts.is_empty() {
        if single_ending {
            cuts.push(tokens.len());
        }
        let mut last = 0;
        for &c in &cuts {
            let part = &tokens[last..c];
            if let (Some(&s), Some(&e)) = (part.first(), part.last())
                && is_ts(s)
                && is_ts(e)
            {
                out.push(Segment {
                    start: at(s),
                    end: at(e),
                    tokens: part.to_vec(),
                });
            }
            last = c;
        }
        if single_ending {
            seek + size
        } else {
            // The last closing timestamp: speech after it runs again.
            let end = tokens[last - 1];
            seek + (end - tb) as usize * FRAMES_PER_POSITION
        }
    } else {
        let mut duration = size as f64 / FRAMES_PER_SECOND as f64;
        if let Some(&t) = tokens.iter().rev().find(|&&t| is_ts(t))
            && t != tb
        {
            duration = f64::from(t - tb) * TIME_PRECISION;
        }
        if tokens.iter().any(|&t| !is_ts(t)) {
            out.push(Segment {
                start: offset,
                end: offset + duration,
                tokens: tokens.to_vec(),
            });
        }
        seek + size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_follows_whisper() {
        // Fine text is kept; repetition or an unlikely text is retried,
        // unless the window is silence.
        assert!(!needs_retry(1.5, -0.3, Some(0.1)));
        assert!(needs_retry(2.6, -0.3, Some(0.1)));
        assert!(needs_retry(1.5, -1.2, None));
        assert!(!needs_retry(1.5, -1.2, Some(0.7)));
        assert!(needs_retry(2.6, -0.3, Some(0.9)));
        assert!(is_silence(Some(0.7), -1.0));
        assert!(!is_silence(Some(0.7), -0.9));
        assert!(!is_silence(Some(0.5), -3.0));
        assert!(!is_silence(None, -3.0));
        // The last attempt, unless all failed: then the most likely that
        // does not repeat itself, else the most likely.
        assert_eq!(pick_attempt(&[(-1.5, 1.0), (-0.5, 1.0)], false), 1);
        assert_eq!(
            pick_attempt(&[(-1.5, 1.0), (-1.2, 3.0), (-1.4, 2.0)], true),
            2
        );
        assert_eq!(pick_attempt(&[(-1.5, 3.0), (-1.2, 3.0)], true), 1);
        assert_eq!(pick_attempt(&[(-1.2, 1.0), (-1.2, 1.0)], true), 0);
    }

    #[test]
    fn seeds_follow_the_window() {
        let a = vec![0.5f32; 100];
        let mut b = a.clone();
        b[99] = 0.25;
        assert_eq!(seed_of(&a), seed_of(&a.clone()));
        assert_ne!(seed_of(&a), seed_of(&b));
    }
}

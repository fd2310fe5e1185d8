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
//! depend on its audio alone, so batching across files and resuming a file
//! from a finished window give the same text as one file run alone.

use super::decode::{Specials, TIME_PRECISION, detect_language, greedy};
use super::mel::{HOP_LENGTH, MelFrontEnd, N_SAMPLES, content_frames};
use super::whisper::Whisper;
use crate::ModelError;

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
    /// Windows per encoder batch.
    pub batch: usize,
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
    model: &Whisper,
    sp: &Specials,
    mel: &MelFrontEnd,
    files: &[&[f32]],
    opts: &TranscribeOptions,
    stop: &dyn Fn() -> bool,
    done: &mut dyn FnMut(usize, Transcript),
) -> Result<(), ModelError> {
    let starts = vec![Partial::default(); files.len()];
    transcribe_from((model, sp, mel), files, starts, opts, stop, &mut |i, e| {
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
    (model, sp, mel): (&Whisper, &Specials, &MelFrontEnd),
    files: &[&[f32]],
    starts: Vec<Partial>,
    opts: &TranscribeOptions,
    stop: &dyn Fn() -> bool,
    events: &mut dyn FnMut(usize, Event<'_>),
) -> Result<(), ModelError> {
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
            .map(|&i| sp.prompt(state[i].language, opts.translate, opts.timestamps))
            .collect();
        let tokens = greedy(model, model.start(&encoded)?, &prompts, sp)?;
        for (k, &i) in round.iter().enumerate() {
            let p = &mut state[i];
            p.windows += 1;
            let size = WINDOW_FRAMES.min(frames[i] - p.seek);
            let next = advance(&tokens[k], p.seek, size, sp, &mut p.segments);
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

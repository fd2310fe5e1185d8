//! Decoding a batch of 30-second windows (greedy, beam search, or sampling
//! at a temperature; see [`Strategy`]) with Whisper's token rules, as the
//! reference engine (CTranslate2) applies them, to every row and every
//! hypothesis:
//! - every step: the model's `suppress_ids` (config.json) are never chosen;
//! - the first step: nor are `suppress_ids_begin` (the blank and the end);
//! - with timestamps: `<|notimestamps|>` never; the first token is a
//!   timestamp no later than 1 s (index 50); timestamps come in pairs except
//!   right before the end; they never go back, and a segment never has zero
//!   length; where the timestamps' total probability is above every text
//!   token's, a timestamp is taken;
//! - at most `min(text_ctx / 2, text_ctx − prompt + 1)` new tokens.
//!
//! Ties between equal logits go to the lowest token id. An initial prompt
//! goes before `<|startoftranscript|>` after `<|startofprev|>`
//! ([`Specials::prompt_after`]).

use std::path::Path;

use serde::Deserialize;

use super::ct2::FAMILY;
use super::whisper::{DecodeState, Whisper};
use crate::ModelError;

/// The latest first timestamp, as an index past `<|0.00|>` (1 s).
const MAX_INITIAL_TIMESTAMP_INDEX: u32 = 50;
/// Earlier tokens a prompt keeps: Whisper's `text_ctx / 2 − 1` (448 / 2 − 1).
pub const MAX_PREVIOUS: usize = 223;
/// Seconds per timestamp step.
pub const TIME_PRECISION: f64 = 0.02;
/// The largest `config.json` or `vocabulary.txt` accepted.
const MAX_TEXT_FILE: u64 = 16 << 20;

/// Whisper's special tokens and the model's suppression lists.
#[derive(Clone, Debug)]
pub struct Specials {
    /// `<|endoftext|>`.
    pub eot: u32,
    /// `<|startoftranscript|>`.
    pub sot: u32,
    /// `<|transcribe|>`.
    pub transcribe: u32,
    /// `<|translate|>`.
    pub translate: u32,
    /// `<|notimestamps|>`.
    pub no_timestamps: u32,
    /// `<|0.00|>`; every id from here to the vocabulary's end is a timestamp.
    pub timestamp_begin: u32,
    /// The last timestamp id.
    pub timestamp_end: u32,
    /// `<|nospeech|>` (or `<|nocaptions|>` in older vocabularies).
    pub no_speech: Option<u32>,
    /// `<|startofprev|>`, which opens an initial prompt.
    pub start_of_prev: Option<u32>,
    /// Language codes and their token ids (`en` → `<|en|>`); empty for an
    /// English-only model.
    pub languages: Vec<(String, u32)>,
    /// Never generated.
    pub suppress: Vec<u32>,
    /// Not generated as the first token.
    pub suppress_begin: Vec<u32>,
}

/// The parts of CTranslate2's Whisper `config.json` this reader uses.
#[derive(Deserialize)]
struct Ct2Config {
    #[serde(default)]
    suppress_ids: Vec<u32>,
    #[serde(default)]
    suppress_ids_begin: Vec<u32>,
    #[serde(default)]
    lang_ids: Vec<u32>,
}

fn invalid(reason: String) -> ModelError {
    ModelError::Invalid {
        family: FAMILY,
        reason,
    }
}

fn read_text(path: &Path) -> Result<String, ModelError> {
    let io = |source| ModelError::Cache {
        path: path.display().to_string(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_TEXT_FILE {
        return Err(invalid(format!(
            "{} is {len} bytes, over {MAX_TEXT_FILE}",
            path.display()
        )));
    }
    std::fs::read_to_string(path).map_err(io)
}

impl Specials {
    /// Reads `dir/vocabulary.txt` (one token per line, line `i` is id `i`)
    /// and `dir/config.json`; `vocab` is the model's output size, which the
    /// vocabulary must match.
    pub fn load(dir: &Path, vocab: usize) -> Result<Self, ModelError> {
        let words = read_text(&dir.join("vocabulary.txt"))?;
        let words: Vec<&str> = words.lines().collect();
        if words.len() != vocab {
            return Err(invalid(format!(
                "vocabulary.txt has {} tokens, the model {vocab}",
                words.len()
            )));
        }
        let config = read_text(&dir.join("config.json"))?;
        let config: Ct2Config =
            serde_json::from_str(&config).map_err(|e| invalid(format!("config.json: {e}")))?;
        Self::from_vocabulary(&words, config)
    }

    fn from_vocabulary(words: &[&str], config: Ct2Config) -> Result<Self, ModelError> {
        let id = |w: &str| {
            words
                .iter()
                .position(|x| *x == w)
                .map(|i| i as u32)
                .ok_or_else(|| invalid(format!("vocabulary.txt lacks {w}")))
        };
        let no_timestamps = id("<|notimestamps|>")?;
        let vocab = words.len() as u32;
        let check = |list: &[u32], what: &str| match list.iter().find(|&&t| t >= vocab) {
            Some(t) => Err(invalid(format!(
                "config.json's {what} has {t}, past the vocabulary"
            ))),
            None => Ok(()),
        };
        check(&config.suppress_ids, "suppress_ids")?;
        check(&config.suppress_ids_begin, "suppress_ids_begin")?;
        check(&config.lang_ids, "lang_ids")?;
        let eot = id("<|endoftext|>")?;
        let sot = id("<|startoftranscript|>")?;
        // English-only models list no languages to choose from.
        let multilingual = words.len() >= 51865;
        let languages = if multilingual {
            config
                .lang_ids
                .iter()
                .filter_map(|&t| {
                    let w = words[t as usize];
                    let code = w.strip_prefix("<|")?.strip_suffix("|>")?;
                    Some((code.to_string(), t))
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            eot,
            sot,
            transcribe: id("<|transcribe|>")?,
            translate: id("<|translate|>")?,
            no_timestamps,
            timestamp_begin: no_timestamps + 1,
            timestamp_end: vocab - 1,
            no_speech: id("<|nospeech|>").or_else(|_| id("<|nocaptions|>")).ok(),
            start_of_prev: id("<|startofprev|>").ok(),
            languages,
            suppress: config.suppress_ids,
            suppress_begin: config.suppress_ids_begin,
        })
    }

    /// Whether the model knows several languages (and takes language and
    /// task tokens in its prompt).
    pub fn multilingual(&self) -> bool {
        !self.languages.is_empty()
    }

    /// The token of language `code` (`en`, `de`, …).
    pub fn language(&self, code: &str) -> Option<u32> {
        self.languages
            .iter()
            .find(|(c, _)| c == code)
            .map(|&(_, t)| t)
    }

    /// The code of language token `t`.
    pub fn language_code(&self, t: u32) -> Option<&str> {
        self.languages
            .iter()
            .find(|&&(_, x)| x == t)
            .map(|(c, _)| c.as_str())
    }

    /// The decoder's prompt: start, then for a multilingual model the
    /// language and the task, then `<|notimestamps|>` without timestamps.
    pub fn prompt(&self, language: Option<u32>, translate: bool, timestamps: bool) -> Vec<u32> {
        self.prompt_after(&[], language, translate, timestamps)
    }

    /// [`Self::prompt`] after earlier text: `<|startofprev|>` and the last
    /// `text_ctx / 2 − 1` tokens of `previous` first, when there are any
    /// (and the model has that token).
    pub fn prompt_after(
        &self,
        previous: &[u32],
        language: Option<u32>,
        translate: bool,
        timestamps: bool,
    ) -> Vec<u32> {
        let mut p = Vec::new();
        if let (Some(prev), false) = (self.start_of_prev, previous.is_empty()) {
            p.push(prev);
            p.extend_from_slice(&previous[previous.len().saturating_sub(MAX_PREVIOUS)..]);
        }
        p.push(self.sot);
        if self.multilingual() {
            if let Some(l) = language {
                p.push(l);
            }
            p.push(if translate {
                self.translate
            } else {
                self.transcribe
            });
        }
        if !timestamps {
            p.push(self.no_timestamps);
        }
        p
    }
}

/// How a window's tokens are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// The most likely token at each step.
    Greedy,
    /// Beam search as the reference engine runs it (patience 1, length
    /// penalty 1): `n` beams, `2n` candidates a step; a window ends when `n`
    /// hypotheses have ended; the best by log-probability per token wins.
    Beam(usize),
    /// `best_of` independent samples at `temperature` (> 0); the one with
    /// the best log-probability per token wins.
    Sample {
        /// Divides the logits before sampling.
        temperature: f32,
        /// Samples per window.
        best_of: usize,
    },
}

impl Strategy {
    /// Decoder rows each window takes.
    pub fn rows_per_window(self) -> usize {
        match self {
            Self::Greedy => 1,
            Self::Beam(n) => n.max(1),
            Self::Sample { best_of, .. } => best_of.max(1),
        }
    }
}

/// One window decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// The new tokens, the end left out.
    pub tokens: Vec<u32>,
    /// `Σ log p` of the tokens and the end, under the masked distribution
    /// (before any temperature); 0 when scores were not asked for.
    pub sum_logprob: f64,
    /// The probability of `<|nospeech|>` at `<|startoftranscript|>`, when
    /// asked for and the model has that token.
    pub no_speech: Option<f32>,
}

impl Decoded {
    /// Log-probability per token, the end counted (Whisper's
    /// `avg_logprob`).
    pub fn avg_logprob(&self) -> f64 {
        self.sum_logprob / (self.tokens.len() + 1) as f64
    }
}

/// What [`decode`] does besides choosing tokens.
#[derive(Clone, Debug, Default)]
pub struct DecodeExtras {
    /// Sum each row's log-probabilities ([`Decoded::sum_logprob`]).
    pub scores: bool,
    /// Measure [`Decoded::no_speech`] (the prompt then runs in two steps,
    /// split after `<|startoftranscript|>`).
    pub no_speech: bool,
    /// One seed per window, for sampling.
    pub seeds: Vec<u64>,
}

/// Decodes every row of `st` (freshly started, one row per window) from
/// its prompt in `prompts` (all of one length, with `<|startoftranscript|>`
/// at the same place) as `strategy` says; returns one [`Decoded`] per
/// window. Timestamp rules apply to a row whose prompt does not end with
/// `<|notimestamps|>`.
pub fn decode(
    model: &Whisper,
    mut st: DecodeState,
    prompts: &[Vec<u32>],
    sp: &Specials,
    strategy: Strategy,
    extras: &DecodeExtras,
) -> Result<Vec<Decoded>, ModelError> {
    let windows = prompts.len();
    let timestamps: Vec<bool> = prompts
        .iter()
        .map(|p| p.last() != Some(&sp.no_timestamps))
        .collect();
    let ctx = model.dims().text_ctx;
    let start = prompts.first().map_or(0, Vec::len).saturating_sub(1);
    let max_new = (ctx / 2).min(ctx.saturating_sub(start));
    let split = match (extras.no_speech, sp.no_speech) {
        (true, Some(_)) => prompts
            .first()
            .and_then(|p| p.iter().position(|&t| t == sp.sot)),
        _ => None,
    };
    let (mut logits, no_speech) = match (split, sp.no_speech) {
        (Some(at), Some(ns)) => {
            let head: Vec<Vec<u32>> = prompts.iter().map(|p| p[..=at].to_vec()).collect();
            let mut logits = model.step(&mut st, &head)?;
            let probs: Vec<f32> = logits
                .iter()
                .map(|r| (r[ns as usize] - log_sum_exp(r)).exp())
                .collect();
            if prompts.iter().all(|p| p.len() > at + 1) {
                let tail: Vec<Vec<u32>> = prompts.iter().map(|p| p[at + 1..].to_vec()).collect();
                logits = model.step(&mut st, &tail)?;
            }
            (logits, Some(probs))
        }
        _ => (model.step(&mut st, prompts)?, None),
    };
    let mut out = match strategy {
        Strategy::Beam(n) if n > 1 => beam(model, st, logits, sp, &timestamps, n, max_new)?,
        Strategy::Greedy | Strategy::Beam(_) => {
            let rows = vec![Pick::Argmax; windows];
            sample(
                model,
                st,
                logits,
                sp,
                &timestamps,
                rows,
                max_new,
                extras.scores,
            )?
        }
        Strategy::Sample {
            temperature,
            best_of,
        } => {
            let copies = best_of.max(1);
            let picks: Vec<Pick> = (0..windows * copies)
                .map(|r| {
                    let seed = extras.seeds.get(r / copies).copied().unwrap_or(0);
                    Pick::Sample {
                        temperature,
                        rng: fastrand::Rng::with_seed(seed ^ (r % copies) as u64),
                    }
                })
                .collect();
            let expand: Vec<usize> = (0..windows * copies).map(|r| r / copies).collect();
            model.keep_rows(&mut st, &expand)?;
            logits = expand.iter().map(|&w| logits[w].clone()).collect();
            let ts: Vec<bool> = expand.iter().map(|&w| timestamps[w]).collect();
            let all = sample(model, st, logits, sp, &ts, picks, max_new, true)?;
            all.chunks(copies)
                .map(|c| best_of_hypotheses(c.iter().map(|d| (&d.tokens, d.sum_logprob))))
                .collect()
        }
    };
    if let Some(p) = no_speech {
        for (d, p) in out.iter_mut().zip(p) {
            d.no_speech = Some(p);
        }
    }
    Ok(out)
}

/// How one row's next token is chosen.
#[derive(Clone, Debug)]
enum Pick {
    /// The most likely (the first of equals).
    Argmax,
    /// Drawn from the masked distribution at `temperature`.
    Sample {
        temperature: f32,
        rng: fastrand::Rng,
    },
}

impl Pick {
    fn choose(&mut self, row: &[f32]) -> u32 {
        match self {
            Self::Argmax => argmax(row),
            Self::Sample { temperature, rng } => {
                let t = temperature.max(1e-6);
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                if m == f32::NEG_INFINITY {
                    return argmax(row);
                }
                let total: f64 = row.iter().map(|&v| f64::from(((v - m) / t).exp())).sum();
                let mut u = rng.f64() * total;
                let mut last = 0;
                for (i, &v) in row.iter().enumerate() {
                    let w = f64::from(((v - m) / t).exp());
                    if w > 0.0 {
                        last = i;
                        u -= w;
                        if u < 0.0 {
                            return i as u32;
                        }
                    }
                }
                last as u32
            }
        }
    }
}

/// The hypothesis with the best log-probability per token (the end not
/// counted, as the reference engine normalises); the first of equals.
fn best_of_hypotheses<'a>(hyps: impl Iterator<Item = (&'a Vec<u32>, f64)>) -> Decoded {
    let mut best: Option<(f64, Decoded)> = None;
    for (tokens, sum) in hyps {
        let norm = if tokens.is_empty() {
            f64::NEG_INFINITY
        } else {
            sum / tokens.len() as f64
        };
        if best.as_ref().is_none_or(|(b, _)| norm > *b) {
            best = Some((
                norm,
                Decoded {
                    tokens: tokens.clone(),
                    sum_logprob: sum,
                    no_speech: None,
                },
            ));
        }
    }
    best.map_or(
        Decoded {
            tokens: Vec::new(),
            sum_logprob: 0.0,
            no_speech: None,
        },
        |(_, d)| d,
    )
}

/// Row by row, one token a step (greedy or sampled), each row ending at
/// its end token; `logits` are the prompt's.
#[allow(clippy::too_many_arguments)]
fn sample(
    model: &Whisper,
    mut st: DecodeState,
    mut logits: Vec<Vec<f32>>,
    sp: &Specials,
    timestamps: &[bool],
    mut picks: Vec<Pick>,
    max_new: usize,
    scores: bool,
) -> Result<Vec<Decoded>, ModelError> {
    let rows = logits.len();
    let mut out: Vec<Decoded> = vec![
        Decoded {
            tokens: Vec::new(),
            sum_logprob: 0.0,
            no_speech: None,
        };
        rows
    ];
    // The state's rows, as indices of `out`.
    let mut alive: Vec<usize> = (0..rows).collect();
    for step in 0..max_new {
        let mut next = Vec::with_capacity(alive.len());
        let mut keep = Vec::with_capacity(alive.len());
        for (r, row) in logits.iter_mut().enumerate() {
            let o = alive[r];
            apply_rules(row, step, &out[o].tokens, sp, timestamps[o]);
            let t = picks[o].choose(row);
            if scores {
                out[o].sum_logprob += f64::from(row[t as usize] - log_sum_exp(row));
            }
            if t == sp.eot {
                continue;
            }
            out[o].tokens.push(t);
            if step + 1 < max_new {
                keep.push(r);
                next.push(vec![t]);
            }
        }
        if keep.is_empty() {
            break;
        }
        if keep.len() < alive.len() {
            model.keep_rows(&mut st, &keep)?;
            alive = keep.iter().map(|&r| alive[r]).collect();
        }
        logits = model.step(&mut st, &next)?;
    }
    Ok(out)
}

/// A hypothesis of [`beam`].
#[derive(Clone, Debug)]
struct Hyp {
    tokens: Vec<u32>,
    score: f32,
}

/// Beam search over windows at once: `logits` are the prompt's, one row
/// per window (the beams are expanded after the first step, as the
/// reference engine does).
fn beam(
    model: &Whisper,
    mut st: DecodeState,
    mut logits: Vec<Vec<f32>>,
    sp: &Specials,
    timestamps: &[bool],
    n: usize,
    max_new: usize,
) -> Result<Vec<Decoded>, ModelError> {
    let windows = logits.len();
    let mut beams: Vec<Vec<Hyp>> = vec![
        vec![Hyp {
            tokens: Vec::new(),
            score: 0.0,
        }];
        windows
    ];
    let mut ended: Vec<Vec<(Vec<u32>, f32)>> = vec![Vec::new(); windows];
    let mut result: Vec<Option<Decoded>> = vec![None; windows];
    let mut alive: Vec<usize> = (0..windows).collect();
    // The window of each of the state's rows.
    let mut layout: Vec<usize> = (0..windows).collect();
    for step in 0..max_new {
        let last = step + 1 == max_new;
        let mut row = 0;
        let mut gather = Vec::new();
        let mut feed = Vec::new();
        let mut still = Vec::new();
        for &w in &alive {
            let hyps = &beams[w];
            // The 2n best continuations: (score, beam, token).
            let mut cands: Vec<(f32, usize, u32)> = Vec::with_capacity(2 * n + 1);
            for (b, h) in hyps.iter().enumerate() {
                let r = &mut logits[row + b];
                apply_rules(r, step, &h.tokens, sp, timestamps[w]);
                let lse = log_sum_exp(r);
                for (t, &v) in r.iter().enumerate() {
                    if v == f32::NEG_INFINITY {
                        continue;
                    }
                    let s = h.score + (v - lse);
                    if cands.len() == 2 * n && cands.last().is_some_and(|c| s <= c.0) {
                        continue;
                    }
                    let at = cands.partition_point(|c| c.0 >= s);
                    cands.insert(at, (s, b, t as u32));
                    cands.truncate(2 * n);
                }
            }
            let base = row;
            row += hyps.len();
            let mut next: Vec<Hyp> = Vec::with_capacity(n);
            let mut secondary = n;
            for k in 0..n.min(cands.len()) {
                let c = cands[k];
                let mut pick = c;
                if c.2 == sp.eot || last {
                    let mut tokens = hyps[c.1].tokens.clone();
                    if c.2 != sp.eot {
                        tokens.push(c.2);
                    }
                    ended[w].push((tokens, c.0));
                    if let Some(j) = (secondary..cands.len()).find(|&j| cands[j].2 != sp.eot) {
                        pick = cands[j];
                        secondary = j + 1;
                    }
                }
                let mut tokens = hyps[pick.1].tokens.clone();
                tokens.push(pick.2);
                next.push(Hyp {
                    tokens,
                    score: pick.0,
                });
                gather.push(base + pick.1);
            }
            if last || ended[w].len() >= n || next.is_empty() {
                result[w] = Some(best_of_hypotheses(
                    ended[w].iter().map(|(t, s)| (t, f64::from(*s))),
                ));
                gather.truncate(gather.len() - next.len());
            } else {
                feed.extend(next.iter().map(|h| vec![h.tokens[h.tokens.len() - 1]]));
                beams[w] = next;
                still.push(w);
            }
        }
        if still.is_empty() {
            break;
        }
        let next_layout: Vec<usize> = gather.iter().map(|&g| layout[g]).collect();
        if next_layout == layout {
            // Beams moved within their windows: the encoder's keys and
            // values stay where they are.
            model.reorder_rows(&mut st, &gather)?;
        } else {
            model.keep_rows(&mut st, &gather)?;
        }
        layout = next_layout;
        logits = model.step(&mut st, &feed)?;
        alive = still;
    }
    Ok(result
        .into_iter()
        .map(|d| {
            d.unwrap_or(Decoded {
                tokens: Vec::new(),
                sum_logprob: 0.0,
                no_speech: None,
            })
        })
        .collect())
}

/// The most likely language of each row of `st` (freshly started), among
/// the model's languages: one decoder step from `<|startoftranscript|>`.
pub fn detect_language(
    model: &Whisper,
    mut st: DecodeState,
    rows: usize,
    sp: &Specials,
) -> Result<Vec<u32>, ModelError> {
    if !sp.multilingual() {
        return Err(ModelError::BadInput(
            "an English-only model detects no language".into(),
        ));
    }
    let logits = model.step(&mut st, &vec![vec![sp.sot]; rows])?;
    Ok(logits
        .iter()
        .map(|row| {
            let mut best = (f32::NEG_INFINITY, sp.languages[0].1);
            for &(_, t) in &sp.languages {
                if row[t as usize] > best.0 {
                    best = (row[t as usize], t);
                }
            }
            best.1
        })
        .collect())
}

/// The first index of the largest value.
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Masks `row` (one row's logits at `step`, after `sofar` new tokens) as
/// the rules in the module's comment say.
fn apply_rules(row: &mut [f32], step: usize, sofar: &[u32], sp: &Specials, timestamps: bool) {
    let off = f32::NEG_INFINITY;
    let ban = |row: &mut [f32], r: std::ops::Range<usize>| {
        let end = r.end.min(row.len());
        if r.start < end {
            row[r.start..end].fill(off);
        }
    };
    for &t in &sp.suppress {
        row[t as usize] = off;
    }
    if step == 0 {
        for &t in &sp.suppress_begin {
            row[t as usize] = off;
        }
    }
    if !timestamps {
        return;
    }
    let tb = sp.timestamp_begin as usize;
    let te = sp.timestamp_end as usize;
    row[sp.no_timestamps as usize] = off;
    let mut check = false;
    if step == 0 {
        ban(row, 0..tb);
        ban(row, tb + MAX_INITIAL_TIMESTAMP_INDEX as usize + 1..te + 1);
    } else {
        let last = sofar[step - 1] as usize;
        if last >= tb {
            let penultimate = if step >= 2 {
                sofar[step - 2] as usize
            } else {
                last
            };
            if penultimate >= tb {
                // A pair is closed: text (or the end) must follow.
                ban(row, tb..te + 1);
            } else {
                // An open segment: its closing timestamp or the end.
                ban(row, 0..sp.eot as usize);
                ban(row, tb..last);
                check = true;
            }
        } else {
            check = true;
            if let Some(&t) = sofar.iter().rev().find(|&&t| t as usize >= tb) {
                ban(row, tb..t as usize + 1);
            }
        }
    }
    if check {
        let max_text = row[..tb].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if log_sum_exp(&row[tb..=te]) > max_text {
            ban(row, 0..tb);
        }
    }
}

/// `log Σ exp(x)`, stable; −∞ for an empty or all −∞ slice.
fn log_sum_exp(x: &[f32]) -> f32 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return m;
    }
    let s: f32 = x.iter().map(|&v| (v - m).exp()).sum();
    m + s.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: 0–9 text, 10 eot, 11 sot, 12 transcribe, 13
    /// translate, 14 notimestamps, 15–25 timestamps.
    fn toy() -> Specials {
        Specials {
            eot: 10,
            sot: 11,
            transcribe: 12,
            translate: 13,
            no_timestamps: 14,
            timestamp_begin: 15,
            timestamp_end: 25,
            no_speech: None,
            start_of_prev: None,
            languages: Vec::new(),
            suppress: vec![3],
            suppress_begin: vec![10],
        }
    }

    fn allowed(row: &[f32]) -> Vec<usize> {
        (0..row.len())
            .filter(|&i| row[i] > f32::NEG_INFINITY)
            .collect()
    }

    #[test]
    fn rules_follow_the_reference() {
        let sp = toy();
        // Without timestamps: the suppressed ids, and the end at first.
        let mut row = vec![0.0; 26];
        apply_rules(&mut row, 0, &[], &sp, false);
        assert_eq!(allowed(&row).len(), 24);
        assert!(row[3] < 0.0 && row[10] < 0.0);
        // First step with timestamps: only <|0.00|>..=index 50 (all here).
        let mut row = vec![0.0; 26];
        apply_rules(&mut row, 0, &[], &sp, true);
        assert_eq!(allowed(&row), (15..=25).collect::<Vec<_>>());
        // After an opening timestamp (penultimate is the same): text next.
        let mut row = vec![0.0; 26];
        apply_rules(&mut row, 1, &[17], &sp, true);
        assert!(allowed(&row).iter().all(|&i| i < 15));
        // After text following <|0.04|>: timestamps must exceed it; with
        // flat logits the timestamps' total wins, so only timestamps.
        let mut row = vec![0.0; 26];
        apply_rules(&mut row, 2, &[17, 5], &sp, true);
        assert_eq!(allowed(&row), (18..=25).collect::<Vec<_>>());
        // A strong text token keeps text allowed.
        let mut row = vec![0.0; 26];
        row[5] = 10.0;
        apply_rules(&mut row, 2, &[17, 5], &sp, true);
        assert!(allowed(&row).contains(&5) && allowed(&row).contains(&20));
        // Closing timestamp after text: the end or a later timestamp (the
        // end made likely, or the timestamps' total would win).
        let mut row = vec![0.0; 26];
        row[10] = 10.0;
        apply_rules(&mut row, 3, &[17, 5, 20], &sp, true);
        assert_eq!(
            allowed(&row),
            [vec![10, 11, 12, 13], (20..=25).collect()].concat()
        );
    }

    /// The random-weight model's vocabulary of 40: 0–29 text, 30 eot, 31
    /// sot, 32 transcribe, 33 translate, 34 notimestamps, 35–39 timestamps.
    fn toy40() -> Specials {
        Specials {
            eot: 30,
            sot: 31,
            transcribe: 32,
            translate: 33,
            no_timestamps: 34,
            timestamp_begin: 35,
            timestamp_end: 39,
            no_speech: Some(29),
            start_of_prev: Some(28),
            languages: Vec::new(),
            suppress: vec![3],
            suppress_begin: vec![30],
        }
    }

    /// Beam search and sampling give each window what it gives alone
    /// (rows of a batch never mix), sampling draws the same for the same
    /// seed, and one beam is greedy.
    #[test]
    fn strategies_keep_windows_apart() -> Result<(), ModelError> {
        use candle_core::Device;
        let f = crate::speech::whisper::tests::tiny();
        let dev = Device::Cpu;
        // Our host kernels, then candle's ops (what a GPU runs).
        for host in [true, false] {
            let model = Whisper::from_file(&f, &dev, host)?;
            check_strategies(&model)?;
        }
        Ok(())
    }

    /// The checks of [`strategies_keep_windows_apart`] on one model.
    fn check_strategies(model: &Whisper) -> Result<(), ModelError> {
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        let sp = toy40();
        let mel = Tensor::randn(0f32, 1.0, (3, 4, 3000), &dev)?;
        let enc = model.encode(&mel)?;
        let prompts = vec![vec![31, 34]; 3];
        let extras = DecodeExtras {
            scores: true,
            no_speech: true,
            seeds: vec![1, 2, 3],
        };
        for strategy in [
            Strategy::Greedy,
            Strategy::Beam(1),
            Strategy::Beam(3),
            Strategy::Sample {
                temperature: 0.7,
                best_of: 3,
            },
        ] {
            let all = decode(model, model.start(&enc)?, &prompts, &sp, strategy, &extras)?;
            assert_eq!(all.len(), 3);
            for (w, d) in all.iter().enumerate() {
                let one = enc.narrow(0, w, 1)?;
                let alone = DecodeExtras {
                    seeds: vec![extras.seeds[w]],
                    ..extras.clone()
                };
                let got = decode(
                    model,
                    model.start(&one)?,
                    &prompts[..1],
                    &sp,
                    strategy,
                    &alone,
                )?;
                assert_eq!(got[0].tokens, d.tokens, "{strategy:?} window {w}");
                assert!((got[0].sum_logprob - d.sum_logprob).abs() < 1e-4);
                assert!(d.no_speech.is_some_and(|p| (0.0..=1.0).contains(&p)));
                assert!(d.tokens.iter().all(|&t| t != 3 && t != 30), "{d:?}");
            }
        }
        let greedy = decode(
            model,
            model.start(&enc)?,
            &prompts,
            &sp,
            Strategy::Greedy,
            &extras,
        )?;
        let beam1 = decode(
            model,
            model.start(&enc)?,
            &prompts,
            &sp,
            Strategy::Beam(1),
            &extras,
        )?;
        assert_eq!(greedy, beam1);
        let sampled = |seeds: Vec<u64>| {
            let e = DecodeExtras {
                seeds,
                ..extras.clone()
            };
            let s = Strategy::Sample {
                temperature: 1.0,
                best_of: 2,
            };
            decode(model, model.start(&enc)?, &prompts, &sp, s, &e)
        };
        assert_eq!(sampled(vec![9, 9, 9])?, sampled(vec![9, 9, 9])?);
        Ok(())
    }

    #[test]
    fn compression_ratio_finds_repetition() {
        use crate::speech::transcribe::{COMPRESSION_RATIO_THRESHOLD, compression_ratio};
        let plain = "He was not an ill-disposed young man, unless to be rather cold hearted.";
        assert!(compression_ratio(plain) < COMPRESSION_RATIO_THRESHOLD);
        let looped = " He might have been a man.".repeat(20);
        assert!(compression_ratio(&looped) > COMPRESSION_RATIO_THRESHOLD);
        assert_eq!(compression_ratio(""), 0.0);
    }

    #[test]
    fn prompts_and_languages() -> Result<(), ModelError> {
        let mut words: Vec<String> = (0..51865).map(|i| format!("t{i}")).collect();
        for (i, w) in [
            (50257, "<|endoftext|>"),
            (50258, "<|startoftranscript|>"),
            (50259, "<|en|>"),
            (50260, "<|de|>"),
            (50358, "<|translate|>"),
            (50359, "<|transcribe|>"),
            (50362, "<|nospeech|>"),
            (50363, "<|notimestamps|>"),
        ] {
            words[i] = w.to_string();
        }
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let config = Ct2Config {
            suppress_ids: vec![1],
            suppress_ids_begin: vec![220, 50257],
            lang_ids: vec![50259, 50260],
        };
        let sp = Specials::from_vocabulary(&words, config)?;
        assert!(sp.multilingual());
        assert_eq!(sp.timestamp_begin, 50364);
        assert_eq!(sp.language("de"), Some(50260));
        assert_eq!(
            sp.prompt(Some(50259), false, true),
            vec![50258, 50259, 50359]
        );
        assert_eq!(
            sp.prompt(Some(50260), true, false),
            vec![50258, 50260, 50358, 50363]
        );
        // An initial prompt: <|startofprev|> and its last 223 tokens first.
        let mut sp = sp;
        sp.start_of_prev = Some(50361);
        let long: Vec<u32> = (0..300).collect();
        let p = sp.prompt_after(&long, Some(50259), false, true);
        assert_eq!(p.len(), 1 + MAX_PREVIOUS + 3);
        assert_eq!((p[0], p[1], p[MAX_PREVIOUS]), (50361, 77, 299));
        assert_eq!(p[MAX_PREVIOUS + 1..], [50258, 50259, 50359]);
        let bad = Ct2Config {
            suppress_ids: vec![60000],
            suppress_ids_begin: vec![],
            lang_ids: vec![],
        };
        assert!(Specials::from_vocabulary(&words, bad).is_err());
        Ok(())
    }
}

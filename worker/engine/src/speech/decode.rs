//! Greedy decoding of a batch of 30-second windows with Whisper's token
//! rules, as the reference engine (CTranslate2) applies them:
//! - every step: the model's `suppress_ids` (config.json) are never chosen;
//! - the first step: nor are `suppress_ids_begin` (the blank and the end);
//! - with timestamps: `<|notimestamps|>` never; the first token is a
//!   timestamp no later than 1 s (index 50); timestamps come in pairs except
//!   right before the end; they never go back, and a segment never has zero
//!   length; where the timestamps' total probability is above every text
//!   token's, a timestamp is taken;
//! - at most `min(text_ctx / 2, text_ctx − prompt + 1)` new tokens.
//!
//! Ties between equal logits go to the lowest token id.

use std::path::Path;

use serde::Deserialize;

use super::ct2::FAMILY;
use super::whisper::{DecodeState, Whisper};
use crate::ModelError;

/// The latest first timestamp, as an index past `<|0.00|>` (1 s).
const MAX_INITIAL_TIMESTAMP_INDEX: u32 = 50;
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
        let mut p = vec![self.sot];
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

/// Greedily decodes every row of `st` (freshly started, one row per
/// window) from its prompt in `prompts` (all of one length); returns each
/// row's new tokens, the end token left out. Timestamp rules apply to a
/// row whose prompt does not end with `<|notimestamps|>`.
pub fn greedy(
    model: &Whisper,
    mut st: DecodeState,
    prompts: &[Vec<u32>],
    sp: &Specials,
) -> Result<Vec<Vec<u32>>, ModelError> {
    let rows = prompts.len();
    let timestamps: Vec<bool> = prompts
        .iter()
        .map(|p| p.last() != Some(&sp.no_timestamps))
        .collect();
    let ctx = model.dims().text_ctx;
    let start = prompts.first().map_or(0, Vec::len).saturating_sub(1);
    let max_new = (ctx / 2).min(ctx.saturating_sub(start));
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); rows];
    // The state's rows, as indices of `out`.
    let mut alive: Vec<usize> = (0..rows).collect();
    let mut logits = model.step(&mut st, prompts)?;
    for step in 0..max_new {
        let mut next = Vec::with_capacity(alive.len());
        let mut keep = Vec::with_capacity(alive.len());
        for (r, row) in logits.iter_mut().enumerate() {
            let sofar = &out[alive[r]];
            apply_rules(row, step, sofar, sp, timestamps[alive[r]]);
            let t = argmax(row);
            if t == sp.eot {
                continue;
            }
            out[alive[r]].push(t);
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
        let bad = Ct2Config {
            suppress_ids: vec![60000],
            suppress_ids_begin: vec![],
            lang_ids: vec![],
        };
        assert!(Specials::from_vocabulary(&words, bad).is_err());
        Ok(())
    }
}

//! Streaming JSONL reader: one record per line, read line by line (a 5 GB
//! file is never held in memory), each line's length bounded, every problem
//! reported with its line number.

use std::io::BufRead;

use minions_schemas::messages::GenerationRecord;

use crate::prompts::{self, GenDefaults};

/// One accepted record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The record's id, when the reader was given an id field (or, for
    /// generation records, when the line has one).
    pub id: Option<String>,
    /// The text to run the model on (embedding jobs; empty otherwise).
    pub text: String,
    /// The prompt and sampling settings (generation jobs).
    pub generation: Option<GenerationRecord>,
    /// The audio file (speech jobs).
    pub audio: Option<minions_schemas::messages::AudioRecord>,
}

/// A problem with one input line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {problem}")]
pub struct LineError {
    /// 1-based line number.
    pub line: u64,
    /// What is wrong with it.
    pub problem: String,
}

/// Why reading stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A line is malformed (and bad lines are not being skipped).
    #[error(transparent)]
    Line(#[from] LineError),
    /// One row of a table input (Parquet, or texts in memory; 1-based) is
    /// malformed (and bad records are not being skipped).
    #[error("row {row}: {problem}")]
    Row {
        /// 1-based row number.
        row: u64,
        /// What is wrong with it.
        problem: String,
    },
    /// The input as a whole cannot be used (a missing or mistyped column,
    /// a corrupt file); says what and where.
    #[error("{0}")]
    Input(String),
    /// The input could not be read.
    #[error("reading input: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads records from a JSONL stream.
pub struct JsonlReader<R> {
    inner: R,
    text_field: String,
    id_field: Option<String>,
    max_line_bytes: usize,
    /// Set for generation jobs: lines are prompts, parsed with these defaults.
    generation: Option<GenDefaults>,
    line: u64,
    /// Records accepted so far.
    accepted: u64,
    buf: Vec<u8>,
    /// Bytes read so far (for progress and hashing callers).
    pub bytes_read: u64,
}

impl<R: BufRead> JsonlReader<R> {
    /// A reader taking the text from `text_field` and the id from `id_field`;
    /// lines longer than `max_line_bytes` are errors.
    pub fn new(inner: R, text_field: &str, id_field: Option<&str>, max_line_bytes: usize) -> Self {
        Self {
            inner,
            text_field: text_field.to_owned(),
            id_field: id_field.map(str::to_owned),
            max_line_bytes,
            generation: None,
            line: 0,
            accepted: 0,
            buf: Vec::new(),
            bytes_read: 0,
        }
    }

    /// Reads generation records (`prompt` or `messages`, or OpenAI batch
    /// lines) instead of texts, filling absent fields from `defaults`.
    pub fn for_generation(mut self, defaults: GenDefaults) -> Self {
        self.generation = Some(defaults);
        self
    }

    /// The next record: `Ok(None)` at the end, `Err(ReadError::Line)` for a
    /// malformed line (the reader can go on after it), blank lines skipped.
    pub fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        loop {
            self.buf.clear();
            let n = read_line_bounded(&mut self.inner, &mut self.buf, self.max_line_bytes)?;
            if n.read == 0 {
                return Ok(None);
            }
            self.bytes_read += n.read as u64;
            self.line += 1;
            if n.truncated {
                return Err(LineError {
                    line: self.line,
                    problem: format!(
                        "longer than {} bytes (raise --max-line-bytes)",
                        self.max_line_bytes
                    ),
                }
                .into());
            }
            let text = trim_ascii(&self.buf);
            if text.is_empty() {
                continue;
            }
            let parsed = self.parse(text);
            if parsed.is_ok() {
                self.accepted += 1;
            }
            return parsed.map(Some).map_err(|problem| {
                LineError {
                    line: self.line,
                    problem,
                }
                .into()
            });
        }
    }

    /// Gives back the underlying reader.
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// The number of the last line read (1-based).
    pub fn line(&self) -> u64 {
        self.line
    }

    fn parse(&self, line: &[u8]) -> Result<Record, String> {
        let value: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| format!("not valid JSON: {e}"))?;
        let obj = value
            .as_object()
            .ok_or_else(|| "expected a JSON object".to_owned())?;
        if let Some(d) = &self.generation {
            let (id, record) = prompts::parse(obj, self.id_field.as_deref(), self.accepted, d)?;
            return Ok(Record {
                id,
                text: String::new(),
                generation: Some(record),
                audio: None,
            });
        }
        let text = match obj.get(&self.text_field) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(format!(
                    "field {:?} is {}, expected a string",
                    self.text_field,
                    kind(other)
                ));
            }
            None => {
                let mut keys: Vec<&str> = obj.keys().map(String::as_str).take(8).collect();
                keys.sort_unstable();
                return Err(format!(
                    "no field {:?} (fields: {}); choose one with --text-field",
                    self.text_field,
                    keys.join(", ")
                ));
            }
        };
        if text.len() > minions_schemas::limits::MAX_TEXT_BYTES {
            return Err(format!(
                "text is {} bytes; the limit is {}",
                text.len(),
                minions_schemas::limits::MAX_TEXT_BYTES
            ));
        }
        let id = match &self.id_field {
            None => None,
            Some(f) => match obj.get(f) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                Some(other) => {
                    return Err(format!(
                        "id field {f:?} is {}, expected a string or number",
                        kind(other)
                    ));
                }
                None => return Err(format!("no id field {f:?}")),
            },
        };
        Ok(Record {
            id,
            text,
            generation: None,
            audio: None,
        })
    }
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

struct LineRead {
    read: usize,
    truncated: bool,
}

/// Reads up to and including the next `\n`, keeping at most `max` bytes in
/// `buf` (the rest of an over-long line is consumed and dropped).
fn read_line_bounded<R: BufRead>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead> {
    let mut read = 0;
    let mut truncated = false;
    loop {
        let available = r.fill_buf()?;
        if available.is_empty() {
            return Ok(LineRead { read, truncated });
        }
        let (chunk, done) = match available.iter().position(|&c| c == b'\n') {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let room = max.saturating_sub(buf.len());
        if chunk.len() > room {
            truncated = true;
            buf.extend_from_slice(&chunk[..room]);
        } else {
            buf.extend_from_slice(chunk);
        }
        let used = chunk.len();
        read += used;
        r.consume(used);
        if done {
            return Ok(LineRead { read, truncated });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(s: &str) -> JsonlReader<&[u8]> {
        JsonlReader::new(s.as_bytes(), "text", None, 64)
    }

    #[test]
    fn reads_records_and_skips_blank_lines() -> Result<(), ReadError> {
        let mut r = reader("{\"text\":\"a\"}\n\n  \n{\"text\":\"b\",\"x\":1}");
        assert_eq!(r.next_record()?.map(|x| x.text), Some("a".into()));
        assert_eq!(r.next_record()?.map(|x| x.text), Some("b".into()));
        assert_eq!(r.line(), 4);
        assert!(r.next_record()?.is_none());
        Ok(())
    }

    #[test]
    fn names_the_line_and_the_problem() {
        let mut r = reader("{\"text\":\"a\"}\n{\"text\": 3}\n{oops\n[1]\n{\"body\":\"x\"}\n");
        assert!(r.next_record().is_ok());
        let e = |r: &mut JsonlReader<&[u8]>| {
            r.next_record()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e2 = e(&mut r);
        assert!(e2.starts_with("line 2:") && e2.contains("a number"), "{e2}");
        let e3 = e(&mut r);
        assert!(
            e3.starts_with("line 3:") && e3.contains("not valid JSON"),
            "{e3}"
        );
        let e4 = e(&mut r);
        assert!(e4.contains("expected a JSON object"), "{e4}");
        let e5 = e(&mut r);
        assert!(
            e5.contains("no field \"text\"") && e5.contains("body"),
            "{e5}"
        );
    }

    #[test]
    fn bounds_line_length_and_recovers() -> Result<(), ReadError> {
        let long = format!(
            "{{\"text\":\"{}\"}}\n{{\"text\":\"ok\"}}\n",
            "x".repeat(200)
        );
        let mut r = reader(&long);
        let err = r
            .next_record()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("line 1") && err.contains("longer than 64"),
            "{err}"
        );
        assert_eq!(r.next_record()?.map(|x| x.text), Some("ok".into()));
        Ok(())
    }

    #[test]
    fn reads_ids() -> Result<(), ReadError> {
        let mut r = JsonlReader::new("{\"id\":7,\"t\":\"a\"}\n".as_bytes(), "t", Some("id"), 100);
        assert_eq!(
            r.next_record()?,
            Some(Record {
                generation: None,
                audio: None,
                id: Some("7".into()),
                text: "a".into()
            })
        );
        Ok(())
    }
}

//! Generation records from JSON input lines: `{"id", "prompt"}` or
//! `{"id", "messages"}` with optional sampling fields, or OpenAI Batch API
//! lines (`{"custom_id", "method", "url", "body": {...}}`) as they are.
//! Every field is checked here, with a message naming it, so a bad record
//! stops the submit at its line before anything is published.

use minions_schemas::messages::{ChatTurn, GenerationRecord, Prompt, SamplingParams};
use serde_json::{Map, Value};

/// Roles a chat message may have.
pub const ROLES: &[&str] = &["system", "user", "assistant", "tool", "developer"];
/// Longest stop string, in bytes.
const MAX_STOP_BYTES: usize = 256;
/// Most messages in one record.
const MAX_MESSAGES: usize = 1024;

/// The job's defaults for fields a record leaves out, and what the model
/// allows.
#[derive(Debug, Clone, PartialEq)]
pub struct GenDefaults {
    /// Tokens to generate per record.
    pub max_tokens: u32,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus mass (1 = off).
    pub top_p: f32,
    /// Top-k (0 = off).
    pub top_k: u32,
    /// The job's seed; a record without one gets a seed derived from this
    /// and its position, so reruns sample the same.
    pub seed: u64,
    /// Stop strings.
    pub stop: Vec<String>,
    /// The model's context in tokens, when known.
    pub context: Option<u32>,
}

impl Default for GenDefaults {
    fn default() -> Self {
        Self {
            max_tokens: SamplingParams::DEFAULT_MAX_TOKENS,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
            stop: Vec::new(),
            context: None,
        }
    }
}

/// A record's seed from the job's seed and its position (SplitMix64).
pub fn derive_seed(job_seed: u64, row: u64) -> u64 {
    let mut z = job_seed ^ row.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn id_of(v: &Value, field: &str) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(format!(
            "{field} is {}, expected a string or number",
            kind(other)
        )),
    }
}

/// Parses one input object as record number `row` (0-based) of the job.
/// Returns the record's id (the `custom_id` of an OpenAI line, else the
/// `id_field`, else `id` when present) and the record.
pub fn parse(
    obj: &Map<String, Value>,
    id_field: Option<&str>,
    row: u64,
    d: &GenDefaults,
) -> Result<(Option<String>, GenerationRecord), String> {
    let (id, body) = match obj.get("body") {
        Some(Value::Object(body)) => {
            if let Some(m) = obj.get("method")
                && m.as_str() != Some("POST")
            {
                return Err(format!("method is {m}, expected \"POST\""));
            }
            match obj.get("url").and_then(Value::as_str) {
                None | Some("/v1/chat/completions") | Some("/v1/completions") => {}
                Some(u) => {
                    return Err(format!(
                        "url {u:?}: only /v1/chat/completions and /v1/completions batch lines run here"
                    ));
                }
            }
            let id = match obj.get("custom_id") {
                Some(v) => id_of(v, "custom_id")?,
                None => return Err("an OpenAI batch line needs a custom_id".into()),
            };
            (Some(id), body)
        }
        Some(other) => return Err(format!("body is {}, expected an object", kind(other))),
        None => {
            let field = id_field.unwrap_or("id");
            let id = match obj.get(field) {
                Some(v) => Some(id_of(v, field)?),
                None if id_field.is_some() => return Err(format!("no id field {field:?}")),
                None => None,
            };
            (id, obj)
        }
    };
    let prompt = match (body.get("messages"), body.get("prompt")) {
        (Some(_), Some(_)) => return Err("has both \"prompt\" and \"messages\"; give one".into()),
        (Some(m), None) => Prompt::Messages(messages(m)?),
        (None, Some(Value::String(p))) => {
            if p.len() > minions_schemas::limits::MAX_TEXT_BYTES {
                return Err(format!(
                    "prompt is {} bytes; the limit is {}",
                    p.len(),
                    minions_schemas::limits::MAX_TEXT_BYTES
                ));
            }
            Prompt::Text(p.clone())
        }
        (None, Some(other)) => return Err(format!("prompt is {}, expected a string", kind(other))),
        (None, None) => {
            let mut keys: Vec<&str> = body.keys().map(String::as_str).take(8).collect();
            keys.sort_unstable();
            return Err(format!(
                "no \"prompt\" or \"messages\" field (fields: {})",
                keys.join(", ")
            ));
        }
    };
    if let Some(n) = body.get("n")
        && n.as_u64() != Some(1)
    {
        return Err(format!("n is {n}; one answer per record is supported"));
    }
    let max_tokens = match body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"))
    {
        None | Some(Value::Null) => d.max_tokens,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= u64::from(u32::MAX) => n as u32,
            _ => {
                return Err(format!(
                    "max_tokens is {v}, expected a whole number of at least 1"
                ));
            }
        },
    };
    if let Some(ctx) = d.context
        && max_tokens > ctx
    {
        return Err(format!(
            "max_tokens {max_tokens} exceeds the model's context of {ctx} tokens"
        ));
    }
    let temperature = number(body, "temperature", f64::from(d.temperature), 0.0, 100.0)? as f32;
    let top_p = number(body, "top_p", f64::from(d.top_p), f64::MIN_POSITIVE, 1.0)? as f32;
    let top_k = match body.get("top_k") {
        None | Some(Value::Null) => d.top_k,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("top_k is {v}, expected a whole number"))?,
    };
    let seed = match body.get("seed") {
        None | Some(Value::Null) => derive_seed(d.seed, row),
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(n), _) => n,
            // OpenAI accepts negative seeds; keep their bits.
            (None, Some(n)) => n as u64,
            _ => return Err(format!("seed is {v}, expected a whole number")),
        },
    };
    let stop = match body.get("stop") {
        None | Some(Value::Null) => d.stop.clone(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("stop holds {}, expected strings", kind(s)))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "stop is {}, expected a string or a list",
                kind(other)
            ));
        }
    };
    if stop.len() > SamplingParams::MAX_STOP {
        return Err(format!(
            "{} stop strings; at most {}",
            stop.len(),
            SamplingParams::MAX_STOP
        ));
    }
    if let Some(s) = stop
        .iter()
        .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(format!(
            "stop string {s:?} must be 1 to {MAX_STOP_BYTES} bytes"
        ));
    }
    Ok((
        id,
        GenerationRecord {
            prompt,
            params: SamplingParams {
                max_tokens,
                temperature,
                top_p,
                top_k,
                seed,
                stop,
            },
        },
    ))
}

fn number(
    body: &Map<String, Value>,
    field: &str,
    default: f64,
    lo: f64,
    hi: f64,
) -> Result<f64, String> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_f64() {
            Some(x) if x >= lo && x <= hi => Ok(x),
            _ => Err(format!(
                "{field} is {v}, expected a number from {lo} to {hi}"
            )),
        },
    }
}

fn messages(v: &Value) -> Result<Vec<ChatTurn>, String> {
    let arr = v
        .as_array()
        .ok_or_else(|| format!("messages is {}, expected a list", kind(v)))?;
    if arr.is_empty() {
        return Err("messages is empty".into());
    }
    if arr.len() > MAX_MESSAGES {
        return Err(format!("{} messages; at most {MAX_MESSAGES}", arr.len()));
    }
    arr.iter()
        .enumerate()
        .map(|(i, m)| {
            let m = m
                .as_object()
                .ok_or_else(|| format!("message {i} is {}, expected an object", kind(m)))?;
            let role = match m.get("role") {
                Some(Value::String(r)) => r.clone(),
                Some(other) => return Err(format!("message {i}: role is {}", kind(other))),
                None => return Err(format!("message {i} has no role")),
            };
            if !ROLES.contains(&role.as_str()) {
                return Err(format!(
                    "message {i} has role {role:?}; expected one of {}",
                    ROLES.join(", ")
                ));
            }
            let content = match m.get("content") {
                Some(Value::String(c)) => c.clone(),
                // OpenAI's content parts: text parts joined.
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (
                            p.get("type").and_then(Value::as_str),
                            p.get("text").and_then(Value::as_str),
                        ) {
                            (Some("text"), Some(t)) => text.push_str(t),
                            _ => {
                                return Err(format!(
                                    "message {i}: only text content parts are supported"
                                ));
                            }
                        }
                    }
                    text
                }
                Some(Value::Null) | None => String::new(),
                Some(other) => return Err(format!("message {i}: content is {}", kind(other))),
            };
            Ok(ChatTurn { role, content })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn prompts_messages_and_openai_lines() -> Result<(), String> {
        let d = GenDefaults::default();
        let (id, r) = parse(
            &obj(serde_json::json!({"id": 7, "prompt": "Hi"})),
            None,
            0,
            &d,
        )?;
        assert_eq!(id.as_deref(), Some("7"));
        assert_eq!(r.prompt, Prompt::Text("Hi".into()));
        assert_eq!(r.params.max_tokens, SamplingParams::DEFAULT_MAX_TOKENS);
        assert_eq!(r.params.seed, derive_seed(0, 0));
        let line = serde_json::json!({"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9,
                     "temperature": 0.5, "stop": "\n", "seed": 3}});
        let (id, r) = parse(&obj(line), None, 4, &d)?;
        assert_eq!(id.as_deref(), Some("req-1"));
        assert_eq!(r.params.max_tokens, 9);
        assert_eq!(r.params.stop, vec!["\n".to_owned()]);
        assert_eq!(r.params.seed, 3);
        assert!(matches!(r.prompt, Prompt::Messages(m) if m[0].role == "user"));
        Ok(())
    }

    #[test]
    fn bad_records_say_what_is_wrong() {
        let d = GenDefaults {
            max_tokens: 10,
            context: Some(100),
            ..GenDefaults::default()
        };
        let err = |v: Value| parse(&obj(v), None, 0, &d).err().unwrap_or_default();
        assert!(
            err(serde_json::json!({"id": 1, "text": "x"}))
                .contains("no \"prompt\" or \"messages\"")
        );
        assert!(
            err(serde_json::json!({"messages": [{"role": "wizard", "content": "x"}]}))
                .contains("role \"wizard\"")
        );
        assert!(
            err(serde_json::json!({"prompt": "x", "max_tokens": 101})).contains("context of 100")
        );
        assert!(err(serde_json::json!({"prompt": "x", "max_tokens": 0})).contains("max_tokens"));
        assert!(err(serde_json::json!({"prompt": "x", "temperature": -1})).contains("temperature"));
        assert!(err(serde_json::json!({"custom_id": "a", "url": "/v1/embeddings", "body": {"input": "x"}})).contains("/v1/embeddings"));
        assert!(err(serde_json::json!({"prompt": 3})).contains("expected a string"));
    }

    #[test]
    fn derived_seeds_differ_by_row() {
        assert_ne!(derive_seed(0, 0), derive_seed(0, 1));
        assert_eq!(derive_seed(5, 9), derive_seed(5, 9));
    }
}

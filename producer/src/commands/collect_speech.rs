//! `minions collect` for speech jobs: one JSON line per audio file in input
//! order (`{"id", "text", "language", "segments": [{"start", "end",
//! "text"}], "duration"}`, plus `"error"` for a file that could not be
//! transcribed), or one subtitle file per audio file (SubRip or WebVTT) in
//! a folder.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use futures::StreamExt;
use minions_schemas::messages::{JobSpec, OutputPayload, Transcription};
use object_store::ObjectStore;

use super::collect::{CollectReport, CollectedShard, part_file, settle_file, shards_in_order};
use crate::cli::CollectFormat;

/// Writes a speech job's transcripts to `path` as `format` says: JSON Lines
/// (`jsonl`), or subtitle files in the folder `path` (`srt`, `vtt`).
pub async fn write(
    store: std::sync::Arc<dyn ObjectStore>,
    spec: &JobSpec,
    path: &Path,
    format: CollectFormat,
) -> anyhow::Result<CollectReport> {
    let subtitles = match format {
        CollectFormat::Jsonl => None,
        CollectFormat::Srt | CollectFormat::Vtt => Some(format),
        CollectFormat::Openai => {
            bail!("--format openai is for generation jobs; a speech job writes jsonl, srt or vtt")
        }
    };
    let (tmp, mut w) = match subtitles {
        None => {
            let (tmp, w) = part_file(path, "jsonl.part")?;
            (Some(tmp), Some(w))
        }
        Some(_) => {
            std::fs::create_dir_all(path)
                .with_context(|| format!("cannot create the folder {}", path.display()))?;
            (None, None)
        }
    };
    let mut outputs = std::pin::pin!(shards_in_order(store, spec, true));
    let (mut rows, mut errors) = (0u64, 0u64);
    let mut names = std::collections::HashSet::new();
    while let Some(shard) = outputs.next().await {
        let CollectedShard { output: out, ids } = shard?;
        let OutputPayload::Transcripts { records } = &out.payload else {
            bail!("shard {} holds no transcripts", out.shard);
        };
        for (i, t) in records.iter().enumerate() {
            let row = out.first_row + i as u64;
            let id = ids
                .as_ref()
                .and_then(|v| v.get(i).cloned())
                .unwrap_or_else(|| row.to_string());
            if t.error.is_some() {
                errors += 1;
            }
            if let Some(w) = w.as_mut() {
                serde_json::to_writer(&mut *w, &line(&id, t))?;
                w.write_all(b"\n")?;
            } else if let Some(f) = subtitles
                && t.error.is_none()
            {
                let file = subtitle_path(path, &id, row, f, &mut names);
                let text = match f {
                    CollectFormat::Vtt => vtt(t),
                    _ => srt(t),
                };
                std::fs::write(&file, text)
                    .with_context(|| format!("cannot write {}", file.display()))?;
            }
        }
        rows += out.rows;
    }
    match (w, tmp) {
        (Some(w), Some(tmp)) => settle_file(w, &tmp, path, rows, spec)?,
        _ if rows != spec.records => bail!(
            "outputs hold {rows} rows, the job has {} records",
            spec.records
        ),
        _ => {}
    }
    tracing::info!(job = %spec.job, files = rows, errors, output = %path.display(), "collected");
    Ok(CollectReport {
        rows,
        dim: 0,
        errors,
    })
}

/// A transcript's JSON line (also what the Python client's `collect()`
/// returns per file).
pub(crate) fn line(id: &str, t: &Transcription) -> serde_json::Value {
    let segments: Vec<serde_json::Value> = t
        .segments
        .iter()
        .map(|s| serde_json::json!({"start": round_ms(s.start), "end": round_ms(s.end), "text": s.text}))
        .collect();
    let mut v = serde_json::json!({
        "id": id,
        "text": t.text,
        "language": t.language,
        "segments": segments,
        "duration": round_ms(t.duration),
    });
    if let Some(e) = &t.error {
        v["error"] = serde_json::Value::String(e.clone());
    }
    v
}

/// Seconds to the millisecond (timestamps are multiples of 20 ms; sums of
/// them carry float noise).
fn round_ms(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

/// The subtitle file for record `id`: its id made a safe file name (path
/// separators and odd characters replaced, leading dots dropped), with the
/// row added when two ids would share a name.
fn subtitle_path(
    dir: &Path,
    id: &str,
    row: u64,
    format: CollectFormat,
    taken: &mut std::collections::HashSet<String>,
) -> PathBuf {
    let stem = Path::new(id)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(id);
    let parent = Path::new(id)
        .parent()
        .and_then(|p| p.to_str())
        .filter(|p| !p.is_empty());
    let raw = match parent {
        Some(p) => format!("{p}_{stem}"),
        None => stem.to_string(),
    };
    let mut safe = raw
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect::<String>()
        .trim_start_matches('.')
        .to_string();
    if safe.is_empty() || !taken.insert(safe.clone()) {
        safe = format!("{safe}_{row}");
        taken.insert(safe.clone());
    }
    let ext = if format == CollectFormat::Vtt {
        "vtt"
    } else {
        "srt"
    };
    dir.join(format!("{safe}.{ext}"))
}

/// `hh:mm:ss<sep>mmm`.
fn clock(s: f64, sep: char) -> String {
    let ms = (s.max(0.0) * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}{sep}{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// SubRip: numbered cues, `hh:mm:ss,mmm --> hh:mm:ss,mmm`.
fn srt(t: &Transcription) -> String {
    let mut out = String::new();
    for (n, s) in t.segments.iter().enumerate() {
        out.push_str(&format!(
            "{}\n{} --> {}\n{}\n\n",
            n + 1,
            clock(s.start, ','),
            clock(s.end, ','),
            s.text.trim()
        ));
    }
    out
}

/// WebVTT: a header, then cues `hh:mm:ss.mmm --> hh:mm:ss.mmm`.
fn vtt(t: &Transcription) -> String {
    let mut out = String::from("WEBVTT\n\n");
    for s in &t.segments {
        out.push_str(&format!(
            "{} --> {}\n{}\n\n",
            clock(s.start, '.'),
            clock(s.end, '.'),
            s.text.trim().replace("-->", "->")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::TranscriptSegment;

    fn sample() -> Transcription {
        Transcription {
            text: "Hello there. Bye.".into(),
            language: Some("en".into()),
            segments: vec![
                TranscriptSegment {
                    start: 0.0,
                    end: 2.5,
                    text: " Hello there.".into(),
                },
                TranscriptSegment {
                    start: 3661.02,
                    end: 3662.0,
                    text: " Bye.".into(),
                },
            ],
            duration: 3662.4000000001,
            error: None,
        }
    }

    #[test]
    fn subtitles_follow_srt_and_vtt() {
        let t = sample();
        assert_eq!(
            srt(&t),
            "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n2\n01:01:01,020 --> 01:01:02,000\nBye.\n\n"
        );
        assert!(vtt(&t).starts_with("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n"));
        let v = line("a", &t);
        assert_eq!(v["duration"], 3662.4);
        assert_eq!(v["segments"][1]["start"], 3661.02);
        assert!(v.get("error").is_none());
    }

    #[test]
    fn subtitle_names_are_safe_and_distinct() {
        let mut taken = std::collections::HashSet::new();
        let dir = Path::new("subs");
        let a = subtitle_path(dir, "calls/0001.mp3", 0, CollectFormat::Srt, &mut taken);
        assert_eq!(a, dir.join("calls_0001.srt"));
        let b = subtitle_path(dir, "calls_0001.wav", 1, CollectFormat::Srt, &mut taken);
        assert_eq!(b, dir.join("calls_0001_1.srt"));
        let c = subtitle_path(dir, "../../etc/x y", 2, CollectFormat::Vtt, &mut taken);
        assert_eq!(c, dir.join("_.._etc_x_y.vtt"));
    }
}

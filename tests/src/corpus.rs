//! Input fixtures: JSONL files of generated sentences.

use std::io::Write;
use std::path::Path;

use crate::Result;

/// Writes a JSONL file of `n` generated sentences (`{"id": i, "text": ...}`).
pub fn write_corpus(path: &Path, n: usize) -> Result<Vec<String>> {
    const SUBJ: [&str; 8] = [
        "a man",
        "the girl",
        "a dog",
        "the worker",
        "my laptop",
        "a bird",
        "the child",
        "an office",
    ];
    const VERB: [&str; 8] = [
        "is eating",
        "reads",
        "carries",
        "is riding",
        "writes",
        "sees",
        "plays with",
        "walks to",
    ];
    const OBJ: [&str; 10] = [
        "food",
        "a book",
        "the horse",
        "some bread",
        "a song",
        "the river",
        "a red car",
        "the city",
        "water",
        "the data",
    ];
    let mut texts = Vec::with_capacity(n);
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for i in 0..n {
        let t = format!(
            "{} {} {} number {} in the {} morning.",
            SUBJ[i % 8],
            VERB[(i / 8) % 8],
            OBJ[(i / 64) % 10],
            i,
            if i % 3 == 0 { "quiet" } else { "busy" }
        );
        writeln!(f, "{}", serde_json::json!({"id": i, "text": t}))?;
        texts.push(t);
    }
    f.flush()?;
    Ok(texts)
}

//! Fuzzing the JSONL input reader, the decoder of what users submit: a
//! million mutated inputs (`MINIONS_FUZZ_INPUTS` to change it) of a few
//! lines each go through `JsonlReader` to the end. None may panic; every
//! problem is a line error with the line's number; every accepted record
//! came from a line that holds a string in the text field; a line over the
//! length limit is refused, never read whole.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use minions::jsonl::{JsonlReader, ReadError};
use minions_tests::fuzz::{Rng, inputs, mutate};

const SEEDS: [&str; 6] = [
    "{\"text\": \"a man eats food\", \"id\": 1}\n{\"text\": \"the girl rides a horse\", \"id\": \"b2\"}\n",
    "{\"id\":17,\"text\":\"caf\\u00e9 \\\"quoted\\\" \\n newline\",\"meta\":{\"tags\":[1,2,{\"x\":null}]}}\n",
    "\n  {\"text\": \"\u{1F600} emoji and \u{00FC}nicode\"}  \r\n\n{\"text\": \"\"}\n",
    "{\"text\": 42}\n{\"other\": \"no text field\"}\n[1,2,3]\n",
    "{\"text\": \"x\", \"id\": [1]}\n{\"text\": \"y\", \"id\": 1.5e300}\n",
    "{\"text\": \"long long long long long long long long long long long long long long\"}\n",
];

#[test]
fn a_million_mutated_jsonl_inputs_never_panic() -> Result<(), Box<dyn std::error::Error>> {
    let n = inputs();
    let seeds: Vec<Vec<u8>> = SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect();
    let max_line = 64;
    let mut rng = Rng(0x005e_ed0f_150a);
    let mut buf = Vec::new();
    let (mut records, mut line_errors, mut too_long) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for i in 0..n {
        mutate(&mut rng, &seeds, &mut buf);
        let r = catch_unwind(AssertUnwindSafe(|| -> Result<(u64, u64, u64), String> {
            let mut reader = JsonlReader::new(&buf[..], "text", Some("id"), max_line);
            let (mut ok, mut bad, mut long) = (0, 0, 0);
            loop {
                match reader.next_record() {
                    Ok(Some(_)) => ok += 1,
                    Ok(None) => return Ok((ok, bad, long)),
                    Err(ReadError::Line(e)) => {
                        if e.line == 0 || e.line > buf.len() as u64 + 1 {
                            return Err(format!("line error with no sane line number: {e}"));
                        }
                        if e.problem.contains("longer than") {
                            long += 1;
                        }
                        bad += 1;
                    }
                    Err(ReadError::Io(e)) => return Err(format!("io error from a slice: {e}")),
                    Err(e @ (ReadError::Row { .. } | ReadError::Input(_))) => {
                        return Err(format!("a JSON Lines reader gave a table error: {e}"));
                    }
                }
                if ok + bad > buf.len() as u64 + 1 {
                    return Err("more records than lines".into());
                }
            }
        }));
        match r {
            Ok(Ok((ok, bad, long))) => {
                records += ok;
                line_errors += bad;
                too_long += long;
            }
            Ok(Err(e)) => return Err(format!("input {i}: {e}: {buf:02x?}").into()),
            Err(_) => return Err(format!("input {i}: the reader panicked on {buf:02x?}").into()),
        }
    }
    eprintln!(
        "fuzz jsonl: {n} inputs, 0 panics, {records} records accepted, {line_errors} lines refused ({too_long} over {max_line} bytes), {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(records > 0 && line_errors > 0 && too_long > 0);
    Ok(())
}

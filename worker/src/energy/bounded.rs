//! Reading other programs' output with bounds: lines no longer than a
//! limit from a long-running child, and the whole output of a short one no
//! larger than a limit, within a timeout. A tool that misbehaves costs the
//! worker a bounded amount of memory and time, never more.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::error::{EnergyError, MAX_QUOTED};

/// Lines from a reader, each at most `max_line` bytes: a longer line is
/// skipped whole. Invalid UTF-8 is replaced, never an error.
pub(crate) struct BoundedLines<R> {
    reader: R,
    /// Bytes read and not yet returned (never more than `max_line`).
    buf: Vec<u8>,
    chunk: Box<[u8]>,
    max_line: usize,
    /// Inside an over-long line: dropping bytes up to the next newline.
    skipping: bool,
    eof: bool,
}

impl<R> std::fmt::Debug for BoundedLines<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedLines")
            .field("buffered", &self.buf.len())
            .field("max_line", &self.max_line)
            .field("eof", &self.eof)
            .finish_non_exhaustive()
    }
}

impl<R: AsyncRead + Unpin> BoundedLines<R> {
    /// Reads `reader` in lines of at most `max_line` bytes.
    pub(crate) fn new(reader: R, max_line: usize) -> Self {
        Self {
            reader,
            buf: Vec::new(),
            chunk: vec![0; 4096].into_boxed_slice(),
            max_line,
            skipping: false,
            eof: false,
        }
    }

    /// The next line without its line ending; `None` at the end. Cancel
    /// safe: dropping the future loses no bytes (the one await is a plain
    /// read, and what it read is stored before the next one).
    pub(crate) async fn next_line(&mut self) -> std::io::Result<Option<String>> {
        loop {
            if let Some(line) = self.take_line() {
                return Ok(Some(line));
            }
            if self.eof {
                if self.buf.is_empty() || self.skipping {
                    self.buf.clear();
                    return Ok(None);
                }
                let rest = std::mem::take(&mut self.buf);
                return Ok(Some(String::from_utf8_lossy(&rest).into_owned()));
            }
            let n = self.reader.read(&mut self.chunk).await?;
            if n == 0 {
                self.eof = true;
            } else {
                let chunk = self.chunk[..n].to_vec();
                self.push(&chunk);
            }
        }
    }

    /// Adds bytes, keeping `buf` within `max_line` plus one pending line.
    fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.skipping {
                match bytes.iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        self.skipping = false;
                        bytes = &bytes[i + 1..];
                    }
                    None => return,
                }
                continue;
            }
            let (part, newline) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (&bytes[..=i], true),
                None => (bytes, false),
            };
            let len_without_newline = self.pending_len() + part.len() - usize::from(newline);
            if len_without_newline > self.max_line {
                // Drop the line: what is buffered of it, and the rest up to
                // its newline.
                self.truncate_pending();
                self.skipping = !newline;
            } else {
                self.buf.extend_from_slice(part);
            }
            bytes = &bytes[part.len()..];
        }
    }

    /// Bytes of the unfinished line at the end of `buf`.
    fn pending_len(&self) -> usize {
        match self.buf.iter().rposition(|&b| b == b'\n') {
            Some(i) => self.buf.len() - i - 1,
            None => self.buf.len(),
        }
    }

    fn truncate_pending(&mut self) {
        let keep = self.buf.len() - self.pending_len();
        self.buf.truncate(keep);
    }

    fn take_line(&mut self) -> Option<String> {
        let i = self.buf.iter().position(|&b| b == b'\n')?;
        let mut line: Vec<u8> = self.buf.drain(..=i).collect();
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Some(String::from_utf8_lossy(&line).into_owned())
    }
}

/// Runs `program` with `args` and returns its standard output: an error
/// when it cannot start, takes longer than `timeout` (it is killed), prints
/// more than `limit` bytes (killed), or exits unsuccessfully (with the
/// start of what it printed, which is where `nvidia-smi` says why).
pub(crate) async fn command_output(
    program: &'static str,
    args: &[&str],
    timeout: Duration,
    limit: usize,
) -> Result<String, EnergyError> {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| EnergyError::tool(program, format!("cannot run it: {e}")))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(EnergyError::tool(program, "no standard output"));
    };
    let run = async {
        let mut bytes = Vec::new();
        stdout
            .take(limit as u64 + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| EnergyError::tool(program, format!("reading its output: {e}")))?;
        if bytes.len() > limit {
            return Err(EnergyError::tool(
                program,
                format!("printed more than {limit} bytes"),
            ));
        }
        let status = child
            .wait()
            .await
            .map_err(|e| EnergyError::tool(program, format!("waiting for it: {e}")))?;
        Ok((status, bytes))
    };
    let (status, bytes) = tokio::time::timeout(timeout, run).await.map_err(|_| {
        EnergyError::tool(
            program,
            format!("took longer than {} ms", timeout.as_millis()),
        )
    })??;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if !status.success() {
        let said: String = text.trim().chars().take(MAX_QUOTED).collect();
        return Err(EnergyError::tool(
            program,
            format!("exited with {status}: {said:?}"),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> std::io::Result<Vec<String>> {
        let mut r = BoundedLines::new(input, max);
        let mut out = Vec::new();
        while let Some(l) = r.next_line().await? {
            out.push(l);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn splits_lines_and_keeps_the_last_unterminated_one() -> std::io::Result<()> {
        assert_eq!(
            lines(b"a\r\nbb\n\nccc", 10).await?,
            vec!["a", "bb", "", "ccc"]
        );
        assert!(lines(b"", 10).await?.is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn skips_lines_longer_than_the_limit() -> std::io::Result<()> {
        let mut input = b"short\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 10_000));
        input.extend(b"\nafter\n");
        input.extend(std::iter::repeat_n(b'y', 50));
        assert_eq!(lines(&input, 16).await?, vec!["short", "after"]);
        Ok(())
    }

    #[tokio::test]
    async fn a_missing_program_is_an_error() {
        let e = command_output("minions-no-such-program", &[], Duration::from_secs(2), 1024).await;
        assert!(matches!(e, Err(EnergyError::Tool { .. })), "{e:?}");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn output_over_the_limit_is_refused() {
        let e = command_output(
            "sh",
            &["-c", "yes minion | head -c 100000"],
            Duration::from_secs(5),
            1024,
        )
        .await;
        match e {
            Err(EnergyError::Tool { reason, .. }) => {
                assert!(reason.contains("more than"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_slow_program_times_out() {
        let e = command_output("sleep", &["5"], Duration::from_millis(100), 1024).await;
        match e {
            Err(EnergyError::Tool { reason, .. }) => assert!(reason.contains("longer"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}

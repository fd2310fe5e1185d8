//! A real S3-compatible server (moto) on loopback for one test.

use std::io::Write;
use std::time::Duration;

use crate::{Proc, Result, ports, tool};

/// IAM users made on a server: name → (access key id, secret).
pub type Users = std::collections::HashMap<String, (String, String)>;

/// A real S3-compatible server (moto) on loopback with one bucket.
pub struct S3Server {
    /// The server process.
    pub proc: Proc,
    /// Its port.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl S3Server {
    /// Starts moto on a port it picks itself (it logs `Running on
    /// http://127.0.0.1:PORT`) with `env`.
    fn spawn(env: &[(String, String)]) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("minions-s3-").tempdir()?;
        let bin = tool("MINIONS_MOTO_BIN", "moto_server")?;
        let mut proc = Proc::spawn(
            "moto",
            &bin,
            &["-H".into(), "127.0.0.1".into(), "-p".into(), "0".into()],
            env,
            dir.path(),
        )?;
        let port = ports::wait_logged_port(&mut proc, 0, "Running on", Duration::from_secs(30))?;
        Ok(Self {
            proc,
            port,
            _dir: dir,
        })
    }

    /// Starts moto and creates `bucket` in it.
    pub fn start(bucket: &str) -> Result<Self> {
        let server = Self::spawn(&[])?;
        server.create_bucket(bucket)?;
        Ok(server)
    }

    /// Starts moto with authentication on, with `bucket` and one IAM user
    /// per `(name, policy)`; returns the server and each user's access key
    /// id and secret. Every request after the set-up is signed and judged
    /// by its user's policy (moto checks actions and resources).
    pub fn start_with_users(
        bucket: &str,
        users: &[(&str, serde_json::Value)],
    ) -> Result<(Self, Users)> {
        // The bucket and three calls per user go unsigned; then moto asks.
        let unsigned = 1 + 3 * users.len();
        let server = Self::spawn(&[("INITIAL_NO_AUTH_ACTION_COUNT".into(), unsigned.to_string())])?;
        let bin = tool("MINIONS_MOTO_BIN", "moto_server")?;
        let python = bin.with_file_name("python");
        let script = crate::workspace_root().join("tests/s3/users.py");
        let policies: serde_json::Map<String, serde_json::Value> = users
            .iter()
            .map(|(n, p)| ((*n).to_owned(), p.clone()))
            .collect();
        let mut child = std::process::Command::new(&python)
            .arg(&script)
            .arg(server.endpoint())
            .arg(bucket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", python.display()))?;
        child
            .stdin
            .take()
            .ok_or("no stdin")?
            .write_all(serde_json::Value::Object(policies).to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(format!(
                "making the S3 users: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let made: Users = serde_json::from_slice(&out.stdout)?;
        Ok((server, made))
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a Minions process needs to use this server.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), "test".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "test".into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
        ]
    }

    fn create_bucket(&self, bucket: &str) -> Result<()> {
        // moto accepts an unsigned bucket creation.
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            s,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut resp = String::new();
        std::io::Read::read_to_string(&mut s, &mut resp)?;
        if resp.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(format!(
                "creating bucket {bucket}: {}",
                resp.lines().next().unwrap_or_default()
            )
            .into())
        }
    }
}

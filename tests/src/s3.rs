//! A real S3-compatible server (moto) on loopback for one test.

use std::io::Write;
use std::time::Duration;

use crate::{Proc, Result, ports, tool};

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
    /// http://127.0.0.1:PORT`) and creates `bucket` in it.
    pub fn start(bucket: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("minions-s3-").tempdir()?;
        let bin = tool("MINIONS_MOTO_BIN", "moto_server")?;
        let mut proc = Proc::spawn(
            "moto",
            &bin,
            &["-H".into(), "127.0.0.1".into(), "-p".into(), "0".into()],
            &[],
            dir.path(),
        )?;
        let port = ports::wait_logged_port(&mut proc, 0, "Running on", Duration::from_secs(30))?;
        let server = Self {
            proc,
            port,
            _dir: dir,
        };
        server.create_bucket(bucket)?;
        Ok(server)
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

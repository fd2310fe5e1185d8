//! HTTP for tests: plain GETs of the watchdog's pages, and a real headless
//! Chromium driven through chromedriver (the W3C WebDriver protocol), for
//! tests that look at the dashboard as a person would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use crate::{Proc, Result, scratch, tool};

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// GETs `url` giving up after `within`; returns the status and the body.
pub fn get_within(url: &str, within: Duration) -> Result<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(within))
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent.get(url).call()?;
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_string()?;
    Ok((status, body))
}

/// GETs `url`; returns the status and the body.
pub fn get(url: &str) -> Result<(u16, String)> {
    let mut r = agent().get(url).call()?;
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_string()?;
    Ok((status, body))
}

/// One HTTP/1.1 request to `addr` from the local address `from` (any of
/// 127.0.0.0/8 on loopback: how a test stands in for a proxy at another
/// address), with `headers` and `body`; returns the status and the whole
/// response (headers and body) as text.
pub fn request_from(
    from: std::net::IpAddr,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&std::net::SocketAddr::new(from, 0).into())?;
    socket.connect_timeout(&addr.into(), Duration::from_secs(5))?;
    let mut stream: std::net::TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes())?;
    let mut out = String::new();
    stream.read_to_string(&mut out)?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {out:.200}"))?;
    Ok((status, out))
}

/// A headless Chromium session. The browser and its driver stop on drop.
pub struct Browser {
    driver: Proc,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

fn webdriver(method: &str, url: &str, body: Option<Value>) -> Result<Value> {
    let a = agent();
    let mut r = match (method, body) {
        ("GET", _) => a.get(url).call()?,
        ("DELETE", _) => a.delete(url).call()?,
        (_, Some(b)) => a.post(url).send_json(b)?,
        (_, None) => a.post(url).send_json(json!({}))?,
    };
    let status = r.status().as_u16();
    let v: Value = r.body_mut().read_json()?;
    if status >= 400 {
        return Err(format!("webdriver {method} {url}: {status} {v}").into());
    }
    Ok(v.get("value").cloned().unwrap_or(Value::Null))
}

impl Browser {
    /// Starts chromedriver and a headless Chromium window of 1400×1000,
    /// logging the driver under `log_dir`.
    pub fn start(log_dir: &Path) -> Result<Self> {
        let driver_bin = tool("CHROMEDRIVER_BIN", "chromedriver")?;
        let chromium = tool("CHROMIUM_BIN", "chromium")?;
        // Port 0: it binds one itself and says which (in its log, which an
        // earlier driver in the same folder may have begun).
        let from = crate::ports::log_len(&log_dir.join("chromedriver.log"));
        let mut driver = Proc::spawn(
            "chromedriver",
            &driver_bin,
            &["--port=0".to_owned()],
            &[],
            log_dir,
        )?;
        let port = crate::ports::wait_logged_port(
            &mut driver,
            from,
            "started successfully on port",
            Duration::from_secs(20),
        )?;
        let base = format!("http://127.0.0.1:{port}");
        let profile = scratch("minions-chromium-")?;
        // Flags as for any headless run on a closed network: no sandbox
        // (root in CI), no background connections, a fresh profile.
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--window-size=1400,1000".to_owned(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium.display().to_string(),
                        "args": args,
                    }
                }
            }
        });
        let v = webdriver("POST", &format!("{base}/session"), Some(caps))?;
        let session = v
            .get("sessionId")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("no session id in {v}"))?
            .to_owned();
        Ok(Self {
            driver,
            base,
            session,
            _profile: profile,
        })
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/session/{}/{tail}", self.base, self.session)
    }

    /// Opens `url` and waits for it to load.
    pub fn open(&self, url: &str) -> Result<()> {
        webdriver("POST", &self.url("url"), Some(json!({ "url": url })))?;
        Ok(())
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub fn eval(&self, script: &str) -> Result<Value> {
        webdriver(
            "POST",
            &self.url("execute/sync"),
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Saves a PNG screenshot of the window to `path`.
    pub fn screenshot(&self, path: &Path) -> Result<PathBuf> {
        let v = webdriver("GET", &self.url("screenshot"), None)?;
        let b64 = v.as_str().ok_or("screenshot is not a string")?;
        let png = base64::engine::general_purpose::STANDARD.decode(b64)?;
        std::fs::write(path, png)?;
        Ok(path.to_path_buf())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = webdriver(
            "DELETE",
            &format!("{}/session/{}", self.base, self.session),
            None,
        );
        self.driver.kill();
    }
}

//! Who may read the dashboard and `/metrics`: every request but `/healthz`
//! and the sign-in page needs a credential unless the server was started
//! with `--http-open`. A credential is a bearer token (`Authorization:
//! Bearer …`, what Prometheus's `authorization` sends), the sign-in cookie
//! (set by `/signin` from a token), or the user a trusted reverse proxy
//! names in `--http-trust-header`, believed only from the addresses of
//! `--http-trust-proxy`. Tokens and roles come from the access file
//! ([`minions_schemas::access`]), read again when it changes. A `metrics`
//! token reads `/metrics` only; viewers read everything; operators may also
//! act.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use minions_schemas::access::{self, AccessList, Role, Who};

/// The address a request came from, as the server saw the connection
/// (over TCP or TLS).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>>
    for Peer
{
    fn connect_info(s: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Self(*s.remote_addr())
    }
}

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, super::tls::TlsListener>>
    for Peer
{
    fn connect_info(s: axum::serve::IncomingStream<'_, super::tls::TlsListener>) -> Self {
        Self(*s.remote_addr())
    }
}

/// The access file, read again when it changes (`minions admin
/// add-viewer` needs no restart), at most once per [`RECHECK`].
#[derive(Debug)]
pub struct AccessFile {
    path: std::path::PathBuf,
    state: std::sync::Mutex<FileState>,
}

#[derive(Debug)]
struct FileState {
    list: Arc<AccessList>,
    modified: Option<std::time::SystemTime>,
    checked: std::time::Instant,
}

/// How often the access file's modification time is looked at.
pub const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl AccessFile {
    /// The list now: the file read again if it changed since it was last
    /// read. A file that no longer reads or parses keeps the last list
    /// (the watchdog says why).
    pub fn list(&self) -> Arc<AccessList> {
        let Ok(mut st) = self.state.lock() else {
            return Arc::new(AccessList::default());
        };
        if st.checked.elapsed() < RECHECK {
            return st.list.clone();
        }
        st.checked = std::time::Instant::now();
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if modified.is_some() && modified != st.modified {
            match read_limited(&self.path)
                .map_err(|e| e.to_string())
                .and_then(|text| AccessList::parse(&text).map_err(|e| e.to_string()))
            {
                Ok(list) => {
                    tracing::info!(file = %self.path.display(), "access file read again");
                    st.list = Arc::new(list);
                }
                Err(e) => tracing::warn!(file = %self.path.display(), error = %e,
                    "the access file changed but cannot be used; keeping the last one read"),
            }
            st.modified = modified;
        }
        st.list.clone()
    }
}

/// How the HTTP server decides who a request is.
#[derive(Debug, Clone, Default)]
pub struct HttpAccess {
    /// Anyone who reaches the server is an operator (`--http-open`).
    pub open: bool,
    /// Tokens and proxy users' roles (`--http-access FILE`), read again
    /// when the file changes; none without a file.
    pub file: Option<Arc<AccessFile>>,
    /// The header a trusted proxy names the user in.
    pub trust_header: Option<HeaderName>,
    /// The proxies believed (their addresses as the server sees them).
    pub trusted_proxies: Vec<IpAddr>,
    /// HTTPS from this certificate chain and key (PEM files).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// Why the access settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum AccessSetupError {
    /// The access file could not be read.
    #[error("--http-access {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The access file does not parse.
    #[error("--http-access {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong, and where.
        source: access::AccessError,
    },
    /// A header name that cannot be one.
    #[error("--http-trust-header {0:?} is not a header name")]
    Header(String),
    /// A trusted header without a proxy to trust it from.
    #[error(
        "--http-trust-header needs --http-trust-proxy ADDRESS (the proxy's address): from anyone else the header could be forged"
    )]
    NoProxy,
}

impl HttpAccess {
    /// The settings from the watchdog's flags.
    pub fn new(
        open: bool,
        access_file: Option<&std::path::Path>,
        trust_header: Option<&str>,
        trusted_proxies: Vec<IpAddr>,
    ) -> Result<Self, AccessSetupError> {
        let file = match access_file {
            None => None,
            Some(path) => {
                let shown = path.display().to_string();
                let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
                let text = read_limited(path).map_err(|source| AccessSetupError::Read {
                    path: shown.clone(),
                    source,
                })?;
                let list = AccessList::parse(&text).map_err(|source| AccessSetupError::Parse {
                    path: shown,
                    source,
                })?;
                let file = AccessFile {
                    path: path.to_owned(),
                    state: std::sync::Mutex::new(FileState {
                        list: Arc::new(list),
                        modified,
                        checked: std::time::Instant::now(),
                    }),
                };
                Some(Arc::new(file))
            }
        };
        let trust_header = match trust_header {
            None => None,
            Some(h) => {
                Some(HeaderName::try_from(h).map_err(|_| AccessSetupError::Header(h.to_owned()))?)
            }
        };
        if trust_header.is_some() && trusted_proxies.is_empty() {
            return Err(AccessSetupError::NoProxy);
        }
        Ok(Self {
            open,
            file,
            trust_header,
            trusted_proxies,
            tls: None,
        })
    }

    /// Whether any credential could pass (else every page answers 401).
    /// An access file counts, even an empty one: tokens added to it later
    /// are read without a restart.
    pub fn can_admit_anyone(&self) -> bool {
        self.open || self.trust_header.is_some() || self.file.is_some()
    }

    /// Tokens and proxy users' roles now.
    pub fn current(&self) -> Arc<AccessList> {
        self.file
            .as_ref()
            .map_or_else(|| Arc::new(AccessList::default()), |f| f.list())
    }

    /// Who the request with `headers` from `peer` is, if its credential
    /// checks out.
    pub fn who(&self, headers: &HeaderMap, peer: IpAddr) -> Option<Who> {
        if self.open {
            return Some(Who {
                name: "anyone".into(),
                role: Role::Operator,
            });
        }
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| access::bearer(v.as_bytes()))
            .or_else(|| {
                headers
                    .get_all(header::COOKIE)
                    .iter()
                    .find_map(|v| access::cookie_token(v.as_bytes()))
            });
        let list = self.current();
        if let Some(who) = token.and_then(|t| list.by_token(t)) {
            return Some(who.clone());
        }
        let name = self.trust_header.as_ref()?;
        if !self.trusted_proxies.contains(&peer) {
            return None;
        }
        let user = access::proxy_user(headers.get(name)?.as_bytes())?;
        Some(Who {
            name: user.to_owned(),
            role: list.user_role(user),
        })
    }
}

fn read_limited(path: &std::path::Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, access::MAX_ACCESS_FILE_BYTES as u64 + 1),
        &mut text,
    )?;
    Ok(text)
}

/// Where the dashboard's actions are posted; only operators may.
pub const ACT_PREFIX: &str = "/act/";

/// Whether a browser sent the request from this site's own pages: an
/// `Origin` naming the `Host` asked, else a `Sec-Fetch-Site` of
/// `same-origin` or `none`. A request with neither (a script, curl) passes:
/// only browsers send credentials on another site's behalf. This keeps
/// another site's page from making a signed-in operator's browser act
/// (the cookie is `SameSite=Strict`, but a proxy's header is sent anyway).
pub fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(origin) = text("origin") {
        let authority = origin
            .split_once("://")
            .map_or(origin, |(_, rest)| rest)
            .trim_end_matches('/');
        return text("host").is_some_and(|host| host.eq_ignore_ascii_case(authority));
    }
    text("sec-fetch-site").is_none_or(|s| s == "same-origin" || s == "none")
}

/// The role a path needs (None: open to anyone).
fn needs(path: &str) -> Option<Role> {
    match path {
        "/healthz" | "/signin" => None,
        "/metrics" => Some(Role::Metrics),
        p if p.starts_with(ACT_PREFIX) => Some(Role::Operator),
        _ => Some(Role::Viewer),
    }
}

/// The middleware: lets a request through with its [`Who`] in its
/// extensions, or answers 401 (a sign-in page for a browser) or 403.
pub async fn guard(
    State(access): State<Arc<HttpAccess>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let who = access.who(request.headers(), peer.ip());
    let Some(need) = needs(&path) else {
        if let Some(who) = who {
            request.extensions_mut().insert(who);
        }
        return next.run(request).await;
    };
    if path.starts_with(ACT_PREFIX) && !same_origin(request.headers()) {
        return (
            StatusCode::FORBIDDEN,
            "an action posted from another site's page is refused\n",
        )
            .into_response();
    }
    match who {
        Some(who) if who.role >= need => {
            request.extensions_mut().insert(who);
            next.run(request).await
        }
        Some(who) => (
            StatusCode::FORBIDDEN,
            format!(
                "{} ({}) may not {} {path}\n",
                who.name,
                who.role.as_str(),
                if need == Role::Operator { "act through" } else { "read" }
            ),
        )
            .into_response(),
        None if path.starts_with("/api/") || path == "/metrics" => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"minions\"")],
            "a credential is needed: Authorization: Bearer TOKEN (from `minions admin add-viewer`)\n",
        )
            .into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"minions\"")],
            axum::response::Html(super::pages::sign_in(None)),
        )
            .into_response(),
    }
}

/// The token a sign-in form posted (`token=…`, URL-encoded form), if it
/// has a token's shape.
pub fn posted_token(body: &[u8]) -> Option<&str> {
    let body = std::str::from_utf8(body).ok()?;
    body.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "token").then(|| access::well_formed(v.trim()))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> Result<HeaderMap, Box<dyn std::error::Error>> {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::try_from(*k)?, HeaderValue::from_str(v)?);
        }
        Ok(h)
    }

    #[test]
    fn actions_from_another_site_are_refused() -> Result<(), Box<dyn std::error::Error>> {
        let host = ("host", "fleet.corp:9464");
        assert!(same_origin(&headers(&[host])?));
        assert!(same_origin(&headers(&[
            host,
            ("origin", "https://fleet.corp:9464")
        ])?));
        assert!(!same_origin(&headers(&[
            host,
            ("origin", "https://evil.example")
        ])?));
        assert!(!same_origin(&headers(&[(
            "origin",
            "https://fleet.corp:9464"
        )])?));
        assert!(same_origin(&headers(&[
            host,
            ("sec-fetch-site", "same-origin")
        ])?));
        assert!(!same_origin(&headers(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])?));
        assert_eq!(needs("/act/worker/w1/drain"), Some(Role::Operator));
        assert_eq!(needs("/"), Some(Role::Viewer));
        Ok(())
    }

    #[test]
    fn tokens_cookies_and_proxy_users() -> Result<(), Box<dyn std::error::Error>> {
        let viewer = access::token_from(&[1; 32]);
        let metrics = access::token_from(&[2; 32]);
        let text = format!(
            "{}{}user operator bob\n",
            access::token_line(Role::Viewer, "ana", &viewer),
            access::token_line(Role::Metrics, "prom", &metrics)
        );
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("access");
        std::fs::write(&file, text)?;
        let proxy: IpAddr = "10.0.0.5".parse()?;
        let elsewhere: IpAddr = "10.0.0.6".parse()?;
        let a = HttpAccess::new(false, Some(&file), Some("X-Forwarded-User"), vec![proxy])?;
        let bearer = format!("Bearer {viewer}");
        let w = a.who(&headers(&[("authorization", &bearer)])?, elsewhere);
        assert_eq!(
            w.map(|w| (w.name, w.role)),
            Some(("ana".into(), Role::Viewer))
        );
        let cookie = format!("{}={metrics}", access::COOKIE);
        let w = a.who(&headers(&[("cookie", &cookie)])?, elsewhere);
        assert_eq!(w.map(|w| w.role), Some(Role::Metrics));
        // The proxy's header, from the proxy only.
        let h = headers(&[("x-forwarded-user", "bob")])?;
        assert_eq!(a.who(&h, proxy).map(|w| w.role), Some(Role::Operator));
        assert_eq!(a.who(&h, elsewhere), None);
        let h = headers(&[("x-forwarded-user", "carol")])?;
        assert_eq!(a.who(&h, proxy).map(|w| w.role), Some(Role::Viewer));
        // Nothing, or a token nobody holds.
        assert_eq!(a.who(&HeaderMap::new(), proxy), None);
        let stranger = format!("Bearer {}", access::token_from(&[3; 32]));
        assert_eq!(
            a.who(&headers(&[("authorization", &stranger)])?, elsewhere),
            None
        );
        assert!(matches!(
            HttpAccess::new(false, None, Some("X-User"), vec![]),
            Err(AccessSetupError::NoProxy)
        ));
        assert!(!HttpAccess::new(false, None, None, vec![])?.can_admit_anyone());
        Ok(())
    }

    #[test]
    fn a_posted_token_is_read_from_the_form() {
        let t = access::token_from(&[4; 32]);
        assert_eq!(
            posted_token(format!("token={t}").as_bytes()),
            Some(t.as_str())
        );
        assert_eq!(
            posted_token(format!("x=1&token={t}").as_bytes()),
            Some(t.as_str())
        );
        assert_eq!(posted_token(b"token=nope"), None);
        assert_eq!(posted_token(&[0xff]), None);
    }
}

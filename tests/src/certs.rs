//! Test TLS certificates: a throwaway authority and a server certificate
//! signed by it.

use std::path::{Path, PathBuf};

use crate::Result;

/// Writes a test certificate authority and a server certificate for
/// `localhost` and 127.0.0.1 signed by it into `dir`; returns the paths of
/// (CA, server certificate, server key).
pub fn write_test_certs(dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Minions test CA");
    let ca = ca_params.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let params = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server-key.pem"),
    );
    std::fs::write(&paths.0, ca.pem())?;
    std::fs::write(&paths.1, cert.pem())?;
    std::fs::write(&paths.2, key.serialize_pem())?;
    Ok(paths)
}

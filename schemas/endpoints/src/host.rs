//! This machine's name, as logs, heartbeats and ids use it.

/// The host name as the system reports it (`/etc/hostname`, `HOSTNAME`,
/// `COMPUTERNAME`), or `host`.
pub fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}

/// `name` reduced to the id alphabet: other characters become `-`, leading
/// and trailing dashes go, at most 40 characters; `fallback` if nothing is left.
pub fn id_prefix(name: &str, fallback: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .chars()
        .take(40)
        .collect();
    if s.is_empty() { fallback.to_owned() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_ids() {
        assert_eq!(id_prefix("Ann's MacBook.local", "x"), "Ann-s-MacBook-local");
        assert_eq!(id_prefix("--", "worker"), "worker");
        assert!(
            minions_schemas::WorkerId::new(format!("{}-a", id_prefix(&"é".repeat(80), "w")))
                .is_ok()
        );
    }
}

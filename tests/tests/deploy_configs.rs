//! Every nats-server config shipped under deploy/ is accepted by the real
//! server (`nats-server -t` checks a config and exits).

use minions_tests::{Result, tool, workspace_root};

#[test]
fn shipped_nats_configs_are_valid() -> Result<()> {
    let bin = tool("NATS_SERVER_BIN", "nats-server")?;
    let dir = workspace_root().join("deploy/nats");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "conf") {
            continue;
        }
        let out = std::process::Command::new(&bin)
            .arg("-c")
            .arg(&path)
            .arg("-t")
            .output()?;
        assert!(
            out.status.success(),
            "{} is refused: {}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked > 0, "no configs found under {}", dir.display());
    Ok(())
}

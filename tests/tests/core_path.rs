//! The core path end to end on a local-directory store.

use minions_tests::{Fleet, Result, core_job_scenario};

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_records_on_two_workers_with_a_local_store() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = core_job_scenario(&mut fleet).await;
    if r.is_err() {
        eprintln!("{}", fleet.logs());
    }
    r
}

//! The core path end to end on a real S3-compatible server (moto) on loopback.

use minions_tests::{Fleet, Result, S3Server, core_job_scenario};

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_records_on_two_workers_with_an_s3_store() -> Result<()> {
    let s3 = S3Server::start("minions-test")?;
    let mut fleet = Fleet::s3(&s3, "minions-test")?;
    let r = core_job_scenario(&mut fleet).await;
    if r.is_err() {
        eprintln!("{}\n--- moto ---\n{}", fleet.logs(), s3.proc.log_tail(30));
    }
    r
}

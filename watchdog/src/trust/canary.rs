//! Judging canaries: every worker, when it starts, runs the known canary
//! shard and sends its answers on `minions.canary.<machine>` (its NATS
//! identity may send on its own machine's subject only). One watchdog of
//! the queue group judges them against the known answer this build
//! carries ([`minions_schemas::canary`]) and replies. A machine that fails
//! is quarantined at once (reason: the canary), so `worker list`, the
//! dashboard and `/metrics` show it and its workers pull nothing until an
//! operator's `minions worker release`; its results made before, by
//! workers that passed their own canaries, stand.

use std::sync::Arc;

use async_nats::jetstream::kv;
use minions_schemas::messages::{CanaryReport, CanaryVerdict, Quarantine};
use minions_schemas::time::now_ms;
use minions_schemas::{SCHEMA_VERSION, WorkerId, canary, decode, limits, subjects};
use tokio_util::sync::CancellationToken;

use crate::view::View;

/// Listens for canaries in the watchdogs' queue group; [`serve`] answers
/// them. Called before the watchdog says it is up, so that a worker
/// started after it finds it listening.
pub async fn listen(
    client: &async_nats::Client,
) -> Result<async_nats::Subscriber, async_nats::SubscribeError> {
    client
        .queue_subscribe(subjects::CANARY_ALL, subjects::WATCHDOG_GROUP.to_owned())
        .await
}

/// Answers the canaries `sub` receives until `stop`.
pub async fn serve(
    client: async_nats::Client,
    mut sub: async_nats::Subscriber,
    quarantine: kv::Store,
    view: Arc<View>,
    me: String,
    stop: CancellationToken,
) {
    while let Some((msg, reply)) = crate::reply::next_request(&mut sub, &stop).await {
        let Some(machine) = subjects::canary_machine(&msg.subject) else {
            continue;
        };
        let verdict = judge(machine, &msg.payload, &me);
        view.count_canary(verdict.passed);
        if !verdict.passed {
            quarantine_machine(&client, &quarantine, machine, &verdict, &me).await;
        }
        crate::reply::send(&client, reply, "canary verdict", &verdict).await;
    }
}

/// The verdict on `payload`, a canary report from `machine`.
fn judge(machine: &str, payload: &[u8], me: &str) -> CanaryVerdict {
    let verdict = |passed: bool, detail: String| CanaryVerdict {
        v: SCHEMA_VERSION,
        passed,
        detail,
        by: me.to_owned(),
    };
    let report: CanaryReport = match decode("canary report", payload, limits::MAX_CANARY_BYTES) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(machine, error = %e, "a canary report does not decode");
            return verdict(false, format!("the report does not decode: {e}"));
        }
    };
    let from = WorkerId::new(report.worker.clone())
        .ok()
        .filter(|w| subjects::machine(w) == machine);
    if from.is_none() {
        return verdict(
            false,
            format!(
                "the report names worker {:?}, not one of machine {machine}",
                report.worker
            ),
        );
    }
    let m = &report.made_by;
    match canary::judge(&report.answers, report.speech.as_ref()) {
        Ok(how) => {
            tracing::info!(machine, worker = %report.worker, build = %m.build, device = %m.device,
                kernel = %m.kernel, detail = %how, "canary passed");
            verdict(true, how)
        }
        Err(why) => {
            tracing::error!(machine, worker = %report.worker, build = %m.build, device = %m.device,
                kernel = %m.kernel, detail = %why, "canary FAILED: quarantining the machine");
            verdict(
                false,
                format!(
                    "{why} (build {}, device {}, kernel path {})",
                    m.build, m.device, m.kernel
                ),
            )
        }
    }
}

/// Writes `machine`'s quarantine record for a failed canary, keeping the
/// strikes an earlier record counted.
async fn quarantine_machine(
    client: &async_nats::Client,
    kv: &kv::Store,
    machine: &str,
    verdict: &CanaryVerdict,
    me: &str,
) {
    let strikes = match kv.get(machine).await {
        Ok(Some(b)) => decode::<Quarantine>("quarantine record", &b, limits::MAX_QUARANTINE_BYTES)
            .map_or(0, |q| q.strikes),
        _ => 0,
    };
    let record = Quarantine {
        v: SCHEMA_VERSION,
        machine: machine.to_owned(),
        quarantined: true,
        strikes,
        reason: format!("failed its canary: {}", verdict.detail),
        by: me.to_owned(),
        at_ms: now_ms(),
    };
    let js = async_nats::jetstream::new(client.clone());
    match super::quarantined::put(kv, &record, Some(&js)).await {
        Ok(_) => tracing::error!(machine, reason = %record.reason,
            "machine quarantined: its workers pull nothing until `minions worker release`"),
        Err(e) => tracing::warn!(machine, error = %e,
            "the quarantine could not be written; the worker still refuses work"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::encode;

    fn report(worker: &str, answers: Vec<minions_schemas::messages::CanaryAnswer>) -> Vec<u8> {
        let r = CanaryReport {
            v: SCHEMA_VERSION,
            worker: worker.into(),
            made_by: minions_schemas::messages::Provenance {
                build: "0.1.0+abc".into(),
                device: "cpu".into(),
                kernel: "avx2".into(),
            },
            answers,
            speech: canary::reference().and_then(|k| k.speech.clone()),
        };
        encode("canary report", &r).unwrap_or_default().to_vec()
    }

    #[test]
    fn the_known_answer_passes_and_a_wrong_or_foreign_one_fails() {
        let known = match canary::reference() {
            Some(r) => r.answers.clone(),
            None => panic!("no known answer"),
        };
        let v = judge("mac-01", &report("mac-01-abc12345", known.clone()), "wd");
        assert!(v.passed, "{v:?}");
        let mut wrong = known.clone();
        wrong[0].data[0] += 1.0;
        let v = judge("mac-01", &report("mac-01-abc12345", wrong), "wd");
        assert!(
            !v.passed && v.detail.contains("text 0") && v.detail.contains("avx2"),
            "{v:?}"
        );
        let v = judge("mac-02", &report("mac-01-abc12345", known), "wd");
        assert!(
            !v.passed && v.detail.contains("not one of machine mac-02"),
            "{v:?}"
        );
        let v = judge("mac-01", b"\x01\x02", "wd");
        assert!(!v.passed && v.detail.contains("does not decode"), "{v:?}");
    }
}

//! Admitting jobs: a producer asks on `minions.submit.<team>.<priority>.<submitter>`
//! ([`minions_schemas::messages::SubmitClaim`]). The NATS server let the
//! producer's identity publish there only for its own teams, priorities and
//! name, so one watchdog of the queue group takes those from the subject,
//! checks that the job's spec in the store says the same, makes the job's
//! consumer (whose metadata the schedule reads) and replies. A producer
//! identity may not make consumers itself: this is how its jobs get a team,
//! a priority and a submitter that it cannot forge.

use std::sync::Arc;

use minions_schemas::messages::{Admission, JobSpec, SubmitClaim};
use minions_schemas::streams::WorkSettings;
use minions_schemas::{SCHEMA_VERSION, decode, keys, limits, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio_util::sync::CancellationToken;

/// Listens for submit claims in the watchdogs' queue group; [`serve`]
/// answers them. Called before the watchdog says it is up.
pub async fn listen(
    client: &async_nats::Client,
) -> Result<async_nats::Subscriber, async_nats::SubscribeError> {
    client
        .queue_subscribe(subjects::SUBMIT_ALL, subjects::WATCHDOG_GROUP.to_owned())
        .await
}

/// What admitting needs.
pub struct Admitter {
    /// Replies go here.
    pub client: async_nats::Client,
    /// Job consumers are made here.
    pub js: async_nats::jetstream::Context,
    /// Specs are read here.
    pub store: Arc<dyn ObjectStore>,
    /// The work stream's settings (for the consumer).
    pub work: WorkSettings,
    /// This watchdog's name.
    pub me: String,
}

/// Answers the claims `sub` receives until `stop`.
pub async fn serve(admitter: Admitter, mut sub: async_nats::Subscriber, stop: CancellationToken) {
    while let Some((msg, reply)) = crate::reply::next_request(&mut sub, &stop).await {
        let refused = admitter.admit(&msg.subject, &msg.payload).await.err();
        let answer = Admission {
            v: SCHEMA_VERSION,
            admitted: refused.is_none(),
            detail: refused.unwrap_or_default(),
            by: admitter.me.clone(),
        };
        crate::reply::send(&admitter.client, reply, "admission", &answer).await;
    }
}

impl Admitter {
    /// Admits the job claimed on `subject` with `payload`, or says why not.
    async fn admit(&self, subject: &str, payload: &[u8]) -> Result<(), String> {
        let (team, priority, submitter) = subjects::parse_submit(subject)
            .ok_or_else(|| format!("{subject} is not a submit subject"))?;
        let claim: SubmitClaim = decode("submit claim", payload, limits::MAX_ADMISSION_BYTES)
            .map_err(|e| format!("the claim does not decode: {e}"))?;
        let job = &claim.job;
        let key = StorePath::from(keys::job_spec(job));
        let got = self
            .store
            .get(&key)
            .await
            .map_err(|e| format!("its spec cannot be read from the store ({key}): {e}"))?;
        if got.meta.size > limits::MAX_SPEC_BYTES as u64 {
            return Err(format!(
                "its spec is {} bytes, over the limit of {}",
                got.meta.size,
                limits::MAX_SPEC_BYTES
            ));
        }
        let bytes = got
            .bytes()
            .await
            .map_err(|e| format!("its spec cannot be read from the store ({key}): {e}"))?;
        let spec: JobSpec = decode("job spec", &bytes, limits::MAX_SPEC_BYTES)
            .map_err(|e| format!("its spec does not decode: {e}"))?;
        let differs = spec_differs(&spec, team, priority, submitter);
        if !differs.is_empty() {
            tracing::warn!(job = %job, subject, differs = %differs.join("; "), "a submit claim refused");
            return Err(format!(
                "its spec does not match the identity's claim: {}",
                differs.join("; ")
            ));
        }
        minions_endpoints::queue::ensure_job_consumer(&self.js, &self.work, &spec)
            .await
            .map_err(|e| format!("its consumer could not be made: {e}"))?;
        tracing::info!(job = %job, team, priority = %priority, submitter = %spec.submitter, "job admitted");
        Ok(())
    }
}

/// Where `spec` disagrees with the claim's subject, in words (empty: it
/// agrees).
fn spec_differs(
    spec: &JobSpec,
    team: &str,
    priority: minions_schemas::messages::Priority,
    submitter: &str,
) -> Vec<String> {
    let mut differs = Vec::new();
    if spec.team != team {
        differs.push(format!(
            "team {:?} in the spec, {team:?} claimed",
            spec.team
        ));
    }
    if spec.priority != priority {
        differs.push(format!(
            "priority {} in the spec, {priority} claimed",
            spec.priority
        ));
    }
    if subjects::submitter_token(&spec.submitter) != submitter {
        differs.push(format!(
            "submitter {:?} in the spec, {submitter:?} claimed",
            spec.submitter
        ));
    }
    differs
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::Priority;

    #[test]
    fn a_spec_must_say_what_the_subject_says() -> Result<(), minions_schemas::IdError> {
        let mut spec = minions_schemas::messages::test_spec_of("j1", 1, 1)?;
        spec.team = "alpha".into();
        spec.priority = Priority::Normal;
        spec.submitter = "ana".into();
        assert!(spec_differs(&spec, "alpha", Priority::Normal, "ana").is_empty());
        let d = spec_differs(&spec, "beta", Priority::High, "bob");
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].contains("\"beta\" claimed"), "{d:?}");
        Ok(())
    }
}

use minions_schemas::ModelHash;

/// Why a model could not be fetched, loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The store has no model with this hash.
    #[error("model {hash} is not in the store (push it with `minions model push`)")]
    Unknown {
        /// The missing model.
        hash: ModelHash,
    },
    /// A model file or the manifest does not match its recorded hash.
    #[error(
        "model {hash}: {what} does not match its hash (expected {expected}, found {found}); re-push the model"
    )]
    HashMismatch {
        /// The model.
        hash: ModelHash,
        /// Which file (or `manifest`).
        what: String,
        /// The recorded hash.
        expected: String,
        /// The hash of the bytes found.
        found: String,
    },
    /// The model folder is not a valid model of its family.
    #[error("model folder is not a valid {family} model: {reason}")]
    Invalid {
        /// The family expected.
        family: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The model is larger than the memory this machine lends (transient:
    /// another machine may take the shard).
    #[error("model needs {needs_mb} MB, more than the {budget_mb} MB of memory this machine lends")]
    TooLarge {
        /// The model's size.
        needs_mb: u64,
        /// What this machine lends.
        budget_mb: u64,
    },
    /// An input cannot be run by this model (e.g. it does not tokenize).
    #[error("bad input: {0}")]
    BadInput(String),
    /// The device failed while running the model.
    #[error("inference failed: {0}")]
    Compute(#[from] candle_core::Error),
    /// Reading or writing the local cache failed.
    #[error("model cache {path}: {source}")]
    Cache {
        /// The path involved.
        path: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// A stage of a split model was lost, refused a pass or answered out of
    /// turn (transient: the group's epoch ends, and the records that were
    /// not finished run again from their prompts).
    #[error("a stage of the group was lost: {0}")]
    StageLost(String),
    /// The store failed while fetching the model (the worker's cache
    /// reports this; the engine itself never touches the store).
    #[error("fetching model from the store: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ModelError {
    /// True when retrying elsewhere cannot help (the shard should be terminated).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::Unknown { .. }
                | Self::HashMismatch { .. }
                | Self::Invalid { .. }
                | Self::BadInput(_)
        )
    }
}

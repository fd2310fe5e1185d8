//! The error and result types every test helper returns.

/// A boxed error for test helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A test helper result.
pub type Result<T> = std::result::Result<T, BoxError>;

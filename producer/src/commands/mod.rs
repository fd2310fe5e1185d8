//! One file per subcommand.

pub mod add_access;
pub mod add_producer;
pub mod add_worker;
pub mod admin;
pub mod audit;
pub mod collect;
pub mod collect_speech;
pub mod dev;
pub mod identity_file;
pub mod job_control;
pub mod jobs;
pub mod model;
pub mod status;
pub mod submit;
pub mod team;
pub mod team_policy;
pub mod usage;
pub mod watch;
pub mod worker;

//! Trusting results from machines the fleet does not control: whether a
//! `done` event is backed by its output ([`backing`]), which done shards are
//! checked by a second worker ([`sample`]), whether two outputs of one
//! shard agree ([`compare`]), what a check round rules ([`judge`]), and
//! whether a starting worker's canary answers are right ([`canary`]).

pub mod backing;
pub mod canary;
pub mod compare;
pub mod judge;
pub mod quarantined;
pub mod sample;

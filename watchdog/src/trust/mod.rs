//! Trusting results from machines the fleet does not control: whether a
//! `done` event is backed by its output ([`backing`]), which done shards are
//! checked by a second worker ([`sample`]), whether two outputs of one
//! shard agree ([`compare`]), and what a check round rules ([`judge`]).

pub mod backing;
pub mod compare;
pub mod judge;
pub mod quarantined;
pub mod sample;

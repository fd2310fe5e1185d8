//! Trusting results from machines the fleet does not control: whether a
//! `done` event is backed by its output ([`backing`]), which done shards are
//! checked by a second worker ([`sample`]), and whether two outputs of one
//! shard agree ([`compare`]).

pub mod backing;
pub mod compare;
pub mod sample;

//! Trusting results from machines the fleet does not control: which done
//! shards are checked by a second worker ([`sample`]), and whether two
//! outputs of one shard agree ([`compare`]).

pub mod compare;
pub mod sample;

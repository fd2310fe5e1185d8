//! A stage frame ([`crate::messages::StagePass`] or
//! [`crate::messages::StageReply`], encoded) cut into parts that fit a NATS
//! message, each with its own checksum, and put together again.
//!
//! Parts of one frame travel in order from one sender (NATS keeps a
//! publisher's order). The [`Assembler`] takes them one by one: a part
//! whose checksum fails, that does not follow the one before, or that
//! would make the frame larger than [`MAX_STAGE_PASS_BYTES`] is refused,
//! and the frame it belonged to is dropped whole, never handed on in part.
//! A first part always begins a new frame.

use serde::{Deserialize, Serialize};

use crate::SCHEMA_VERSION;
use crate::codec::{CodecError, decode, encode};
use crate::limits::{MAX_STAGE_PART_BYTES, MAX_STAGE_PASS_BYTES};

/// A frame's bytes carried by one part, well under
/// [`MAX_STAGE_PART_BYTES`] with the part's own fields.
pub const PART_DATA_BYTES: usize = 768 * 1024;

/// One part of a frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagePart {
    /// Schema version.
    pub v: u16,
    /// The frame's epoch and pass number, so a part is known without the
    /// frame.
    pub epoch: u64,
    /// See [`StagePart::epoch`].
    pub pass: u64,
    /// This part's index, from 0.
    pub part: u32,
    /// Parts in the frame.
    pub parts: u32,
    /// The whole frame's length in bytes.
    pub total: u64,
    /// CRC-32 of [`StagePart::bytes`].
    pub crc: u32,
    /// This part of the frame.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// Why a part was refused.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The part does not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Its bytes do not match its checksum.
    #[error("part {part} of pass {pass} (epoch {epoch}) is garbled: its checksum does not match")]
    Garbled {
        /// The epoch.
        epoch: u64,
        /// The pass.
        pass: u64,
        /// The part.
        part: u32,
    },
    /// It does not follow the part before.
    #[error("part {part} of pass {pass} (epoch {epoch}) came out of order: {expected}")]
    OutOfOrder {
        /// The epoch.
        epoch: u64,
        /// The pass.
        pass: u64,
        /// The part.
        part: u32,
        /// What was expected, in words.
        expected: String,
    },
    /// The frame would be larger than the limit, or its parts disagree on
    /// its size.
    #[error("pass {pass} (epoch {epoch}) is {total} bytes in {parts} parts; the limit is {limit}")]
    BadSize {
        /// The epoch.
        epoch: u64,
        /// The pass.
        pass: u64,
        /// The size claimed.
        total: u64,
        /// The parts claimed.
        parts: u32,
        /// The limit.
        limit: usize,
    },
}

/// Cuts an encoded frame into encoded parts.
pub fn cut(epoch: u64, pass: u64, frame: &[u8]) -> Result<Vec<Vec<u8>>, CodecError> {
    let pieces: Vec<&[u8]> = if frame.is_empty() {
        vec![frame]
    } else {
        frame.chunks(PART_DATA_BYTES).collect()
    };
    let parts = pieces.len() as u32;
    pieces
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            encode(
                "stage part",
                &StagePart {
                    v: SCHEMA_VERSION,
                    epoch,
                    pass,
                    part: i as u32,
                    parts,
                    total: frame.len() as u64,
                    crc: crc32fast::hash(bytes),
                    bytes: bytes.to_vec(),
                },
            )
        })
        .collect()
}

/// Puts parts together into frames; see the module's rules.
#[derive(Debug, Default)]
pub struct Assembler {
    /// The frame being put together: its first part's fields and the bytes
    /// so far.
    partial: Option<(StagePart, Vec<u8>)>,
}

impl Assembler {
    /// Takes one part from the wire; returns the frame when it is whole.
    pub fn push(&mut self, wire: &[u8]) -> Result<Option<(u64, u64, Vec<u8>)>, FrameError> {
        let part: StagePart = decode("stage part", wire, MAX_STAGE_PART_BYTES)?;
        if crc32fast::hash(&part.bytes) != part.crc {
            self.partial = None;
            return Err(FrameError::Garbled {
                epoch: part.epoch,
                pass: part.pass,
                part: part.part,
            });
        }
        let parts_hold = u64::from(part.parts) * PART_DATA_BYTES as u64;
        if part.total > MAX_STAGE_PASS_BYTES as u64
            || part.parts == 0
            || part.total > parts_hold
            || part.bytes.len() > PART_DATA_BYTES
        {
            self.partial = None;
            return Err(FrameError::BadSize {
                epoch: part.epoch,
                pass: part.pass,
                total: part.total,
                parts: part.parts,
                limit: MAX_STAGE_PASS_BYTES,
            });
        }
        let (first, mut bytes) = match self.partial.take() {
            // A first part always begins a frame: one left unfinished (its
            // sender moved on to a new epoch) is dropped.
            _ if part.part == 0 => {
                // The size is checked above; reserving it is bounded.
                let bytes = Vec::with_capacity(part.total as usize);
                (part.clone(), bytes)
            }
            None => {
                return Err(FrameError::OutOfOrder {
                    epoch: part.epoch,
                    pass: part.pass,
                    part: part.part,
                    expected: "no frame was begun (its first part was lost or refused)".into(),
                });
            }
            Some((first, bytes)) => {
                let next = (bytes.len() / PART_DATA_BYTES) as u32;
                if (part.epoch, part.pass, part.parts, part.total)
                    != (first.epoch, first.pass, first.parts, first.total)
                    || part.part != next
                {
                    return Err(FrameError::OutOfOrder {
                        epoch: part.epoch,
                        pass: part.pass,
                        part: part.part,
                        expected: format!(
                            "part {next} of pass {} (epoch {}); that frame is dropped",
                            first.pass, first.epoch
                        ),
                    });
                }
                (first, bytes)
            }
        };
        bytes.extend_from_slice(&part.bytes);
        let last = part.part + 1 == first.parts;
        if bytes.len() as u64 > first.total
            || (last && bytes.len() as u64 != first.total)
            || (!last && part.bytes.len() != PART_DATA_BYTES)
        {
            return Err(FrameError::BadSize {
                epoch: first.epoch,
                pass: first.pass,
                total: first.total,
                parts: first.parts,
                limit: MAX_STAGE_PASS_BYTES,
            });
        }
        if last {
            return Ok(Some((first.epoch, first.pass, bytes)));
        }
        self.partial = Some((first, bytes));
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn a_frame_cut_into_parts_comes_back_whole() -> Result<(), FrameError> {
        for len in [
            0,
            10,
            PART_DATA_BYTES,
            PART_DATA_BYTES + 1,
            3 * PART_DATA_BYTES - 7,
        ] {
            let f = frame(len);
            let parts = cut(4, 9, &f)?;
            assert_eq!(parts.len(), len.div_ceil(PART_DATA_BYTES).max(1));
            assert!(parts.iter().all(|p| p.len() <= MAX_STAGE_PART_BYTES));
            let mut a = Assembler::default();
            let mut got = None;
            for (i, p) in parts.iter().enumerate() {
                let r = a.push(p)?;
                assert_eq!(r.is_some(), i + 1 == parts.len());
                got = r;
            }
            assert_eq!(got, Some((4, 9, f)));
        }
        Ok(())
    }

    #[test]
    fn garbled_missing_and_oversized_parts_are_refused() -> Result<(), FrameError> {
        let f = frame(2 * PART_DATA_BYTES + 5);
        let parts = cut(1, 2, &f)?;
        // A flipped byte inside a part's data.
        let mut bad = parts[1].clone();
        let at = bad.len() - 10;
        bad[at] ^= 0x40;
        let mut a = Assembler::default();
        assert!(a.push(&parts[0])?.is_none());
        assert!(matches!(
            a.push(&bad),
            Err(FrameError::Garbled { part: 1, .. })
        ));
        // The frame is dropped whole: its last part alone is refused.
        assert!(matches!(
            a.push(&parts[2]),
            Err(FrameError::OutOfOrder { .. })
        ));
        // A part skipped.
        let mut a = Assembler::default();
        a.push(&parts[0])?;
        assert!(matches!(
            a.push(&parts[2]),
            Err(FrameError::OutOfOrder { part: 2, .. })
        ));
        // Another pass's part in the middle of a frame.
        let other = cut(1, 3, &frame(PART_DATA_BYTES + 1))?;
        let mut a = Assembler::default();
        a.push(&parts[0])?;
        assert!(matches!(
            a.push(&other[1]),
            Err(FrameError::OutOfOrder { pass: 3, .. })
        ));
        // A claimed size over the limit is refused before anything is kept.
        let huge = encode(
            "stage part",
            &StagePart {
                v: SCHEMA_VERSION,
                epoch: 1,
                pass: 1,
                part: 0,
                parts: u32::MAX,
                total: u64::MAX,
                crc: crc32fast::hash(b"x"),
                bytes: b"x".to_vec(),
            },
        )?;
        assert!(matches!(
            Assembler::default().push(&huge),
            Err(FrameError::BadSize { .. })
        ));
        // And a frame whose parts come again after it is whole is a new
        // frame, not an extension of the old one.
        let one = cut(5, 6, b"abc")?;
        let mut a = Assembler::default();
        assert_eq!(a.push(&one[0])?, Some((5, 6, b"abc".to_vec())));
        assert_eq!(a.push(&one[0])?, Some((5, 6, b"abc".to_vec())));
        Ok(())
    }
}

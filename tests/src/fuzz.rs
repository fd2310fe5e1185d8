//! A small seeded mutator for fuzzing decoders on stable Rust (libFuzzer
//! needs a nightly compiler): valid encodings are bit-flipped, overwritten
//! with format markers, cut, spliced, repeated and replaced by random bytes.
//! Seeded, so a failure names the seed and input number that reproduce it.

/// xorshift64*: small, seeded, good enough to pick mutations.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// Bytes that MessagePack gives meaning to: markers of every type and
/// lengths at their limits.
pub const INTERESTING: [u8; 24] = [
    0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc6, 0xcf, 0xd3,
    0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff,
];

/// Replaces `out` with a mutation of one of `seeds` (1 to 4 edits), or
/// (one time in 20) with random bytes.
pub fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    if rng.below(20) == 0 {
        let n = rng.below(256);
        out.extend((0..n).map(|_| rng.next_u64() as u8));
        return;
    }
    out.extend_from_slice(&seeds[rng.below(seeds.len())]);
    for _ in 0..1 + rng.below(4) {
        let len = out.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(8);
                for k in 0..n {
                    out.insert(i + k, rng.next_u64() as u8);
                }
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(16));
                out.drain(i..i + n);
            }
            4 => out.truncate(rng.below(len + 1)),
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let i = rng.below(len + 1);
                let j = rng.below(other.len() + 1);
                out.truncate(i);
                out.extend_from_slice(&other[j..]);
            }
            6 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(32));
                let chunk: Vec<u8> = out[i..i + n].to_vec();
                let at = rng.below(len + 1);
                for (k, b) in chunk.into_iter().enumerate() {
                    out.insert(at + k, b);
                }
            }
            _ if len > 0 => {
                // A length or count field set near its maximum.
                let i = rng.below(len);
                out[i] = [0xdb, 0xdd, 0xdf, 0xc6, 0xcf][rng.below(5)];
                for k in 1..=4 {
                    if let Some(b) = out.get_mut(i + k) {
                        *b = 0xff;
                    }
                }
            }
            _ => {}
        }
    }
}

/// How many inputs each decoder gets: `MINIONS_FUZZ_INPUTS`, default a
/// million.
pub fn inputs() -> u64 {
    std::env::var("MINIONS_FUZZ_INPUTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000)
}

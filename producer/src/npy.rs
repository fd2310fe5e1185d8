//! Writing NumPy `.npy` files (format 1.0): a header, then row-major data.

use std::io::Write;

/// Builds the header of a little-endian float32 array of `shape`.
pub fn f32_header(rows: u64, cols: u64) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // magic (6) + version (2) + header length (2) + dict + padding + '\n' is a multiple of 64.
    let unpadded = 10 + dict.len() + 1;
    let pad = (64 - unpadded % 64) % 64;
    let len = dict.len() + pad + 1;
    let mut out = Vec::with_capacity(10 + len);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(u16::try_from(len).unwrap_or(u16::MAX)).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    out
}

/// Writes the header for a `rows × cols` float32 array to `w`.
pub fn write_f32_header<W: Write>(w: &mut W, rows: u64, cols: u64) -> std::io::Result<()> {
    w.write_all(&f32_header(rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_readable() {
        let h = f32_header(10000, 384);
        assert_eq!(h.len() % 64, 0);
        assert!(h.starts_with(b"\x93NUMPY\x01\x00"));
        let text = String::from_utf8_lossy(&h[10..]);
        assert!(text.contains("'shape': (10000, 384)"), "{text}");
        assert!(text.ends_with('\n'));
    }
}

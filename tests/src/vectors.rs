//! The vectors a job produced: reading `minions collect`'s `.npy` files and
//! comparing them with in-process results.

use std::path::Path;

use crate::Result;

/// Reads a float32 `.npy` file written by `minions collect`: (rows, cols, data).
pub fn read_npy_f32(path: &Path) -> Result<(usize, usize, Vec<f32>)> {
    let bytes = std::fs::read(path)?;
    if !bytes.starts_with(b"\x93NUMPY\x01\x00") {
        return Err("not an npy v1 file".into());
    }
    let hlen = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
    let header = std::str::from_utf8(&bytes[10..10 + hlen])?;
    if !header.contains("'descr': '<f4'") {
        return Err(format!("not float32: {header}").into());
    }
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or("no shape")?;
    let dims: Vec<usize> = shape
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse())
        .collect::<std::result::Result<_, _>>()?;
    let data: Vec<f32> = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (r, c) = (dims[0], dims[1]);
    if data.len() != r * c {
        return Err(format!("npy holds {} floats, shape says {r}x{c}", data.len()).into());
    }
    Ok((r, c, data))
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

//! Arrays as the bytes ranks exchange: a type tag, then the values as little-endian f32 (exact for
//! every float type a model computes in), rebuilt on the receiving side in the sender's type.

use nuvec::{Array, DType, Device};

use crate::{Error, Result};

const TYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The bytes of `a` (a float array) that [`decode`] rebuilds.
pub(super) fn encode(a: &Array) -> Result<Vec<u8>> {
    let tag = TYPES
        .iter()
        .position(|&t| t == a.dtype())
        .ok_or_else(|| Error::Unsupported(format!("a pipeline stage passes float arrays on, not {}", a.dtype())))?;
    let mut bytes = vec![tag as u8];
    bytes.extend(le_bytes(&a.to_f32_vec()?));
    Ok(bytes)
}

/// `values` as little-endian bytes.
pub(super) fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The f32 values of little-endian `bytes` ([`le_bytes`]'s).
pub(super) fn le_values(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// How many bytes [`encode`] makes of an array of `elements` values.
pub(super) fn encoded_len(elements: usize) -> usize {
    1 + 4 * elements
}

/// The array of `shape` on `device` that `bytes` ([`encode`]'s) hold; `from` names the sender.
pub(super) fn decode(bytes: &[u8], shape: &[usize], device: Device, from: &str) -> Result<Array> {
    let elements: usize = shape.iter().product();
    let tag = match bytes.first() {
        Some(&t) if bytes.len() == encoded_len(elements) && (t as usize) < TYPES.len() => t as usize,
        _ => {
            return Err(Error::Invalid(format!(
                "{from} sent {} bytes where an array of shape {shape:?} was expected: do every rank's model and \
                 step agree?",
                bytes.len()
            )))
        }
    };
    let values: Vec<f32> = bytes[1..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let a = Array::from_slice_on(&values, shape, device)?;
    Ok(match TYPES[tag] {
        DType::F32 => a,
        t => a.astype(t)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_come_back_in_their_type_and_values() {
        let values = [1.0f32, -2.5, 3.0e-3, 65504.0, -0.0, 7.25];
        for t in TYPES {
            let a = Array::from_slice(&values, &[2, 3]).unwrap().astype(t).unwrap();
            let bytes = encode(&a).unwrap();
            assert_eq!(bytes.len(), encoded_len(6));
            let b = decode(&bytes, &[2, 3], Device::Cpu, "rank 1").unwrap();
            assert_eq!((b.dtype(), b.shape()), (t, &[2usize, 3][..]));
            assert_eq!(b.to_f32_vec().unwrap(), a.to_f32_vec().unwrap());
        }
        let e = decode(&[0u8; 5], &[2, 3], Device::Cpu, "rank 1").unwrap_err().to_string();
        assert!(e.contains("rank 1 sent 5 bytes"), "{e}");
    }
}

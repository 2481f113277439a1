//! What every rank of a split model must agree on: sums of partial products, the logits sampled
//! from, and the seed they are sampled with.

use nuvec::distributed::Group;
use nuvec::{Array, Device};

use super::wire;
use crate::Result;

/// The sum over every rank of `group` of its `y` (each rank's product of its share of a layer's
/// inputs), in f32 and given back in `y`'s type. Every rank gathers every share and adds them in
/// rank order, so that all hold the same bits: a mixture-of-experts router on the sum then picks
/// the same experts on every rank, which an all-reduce free to add in another order on each rank
/// would not promise at a near-tie.
pub(crate) fn sum_over(group: &Group, y: Array) -> Result<Array> {
    let bytes = wire::le_bytes(&y.to_f32_vec()?);
    let all = group.all_gather(&bytes)?;
    let mut sum = vec![0f32; y.len()];
    for share in all.chunks_exact(bytes.len().max(1)) {
        for (s, v) in sum.iter_mut().zip(wire::le_values(share)) {
            *s += v;
        }
    }
    let sum = Array::from_slice_on(&sum, y.shape(), y.device())?;
    Ok(sum.astype(y.dtype())?)
}

/// The logits `[rows, vocab]` of rank 0 on every rank: `head()` there, broadcast; so that every
/// rank samples from the same values, whatever rounding its own would have had.
pub(crate) fn logits_of_rank0(
    group: &Group,
    (rows, vocab): (usize, usize),
    device: Device,
    head: impl FnOnce() -> Result<Array>,
) -> Result<Array> {
    if group.rank() == 0 {
        let logits = head()?;
        let mut bytes = wire::encode(&logits)?;
        group.broadcast(0, &mut bytes)?;
        return Ok(logits);
    }
    let mut bytes = vec![0u8; wire::encoded_len(rows * vocab)];
    group.broadcast(0, &mut bytes)?;
    wire::decode(&bytes, &[rows, vocab], device, "rank 0")
}

/// A seed rank 0 draws, the same on every rank: the random stream of a request that gives none,
/// so that every rank samples the same tokens.
pub(crate) fn seed_of_rank0(group: &Group) -> Result<u64> {
    let mut bytes = rand::random::<u64>().to_le_bytes();
    group.broadcast(0, &mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

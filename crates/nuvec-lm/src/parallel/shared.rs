//! What every rank of a split model must agree on: sums of partial products, the logits sampled
//! from, and the seed they are sampled with.

use nuvec::distributed::Group;
use nuvec::{Array, Device, Matrix};

use super::{wire, Shard, Stage};
use crate::{Error, Result};

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

/// The logits of `hidden`'s rows through `head` (this rank's output head; `None` on a pipeline
/// stage without it) on a model that may be split across ranks: a pipeline's from its last
/// stage (rank 0), shared; a split model's gathered by vocabulary (`(shard, true)`: `head` is
/// this rank's share of the vocabulary) or rank 0's, broadcast; a whole model's, the product.
pub(crate) fn logits_of(
    hidden: &Array,
    head: Option<&Matrix>,
    stage: Option<&Stage>,
    shard: Option<(&Shard, bool)>,
) -> Result<Array> {
    let product = || match head {
        Some(head) => Ok(hidden.linear(head)?),
        None => Err(Error::Invalid("this pipeline stage holds no output head".into())),
    };
    match (stage, shard) {
        (Some(stage), _) => stage.share_logits(hidden.dim(0), product),
        (None, Some((shard, true))) => logits_by_vocab(shard.group(), product()?),
        (None, Some((shard, false))) => {
            let vocab = head.map_or(0, Matrix::rows);
            logits_of_rank0(shard.group(), (hidden.dim(0), vocab), hidden.device(), product)
        }
        (None, None) => product(),
    }
}

/// The logits `[rows, vocab]` of rank 0 on every rank: `head()` there, broadcast; so that every
/// rank samples from the same values, whatever rounding its own would have had.
pub(super) fn logits_of_rank0(
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

/// The logits `[rows, vocab]` of an output head split by vocabulary over `group`: this rank's
/// `part` (`[rows, vocab / ranks]`, the logits of its share of the head's rows) and every other
/// rank's, gathered in rank order, the same on every rank.
fn logits_by_vocab(group: &Group, part: Array) -> Result<Array> {
    let (rows, share, ranks) = (part.dim(0), part.dim(1), group.size());
    let bytes = wire::le_bytes(&part.to_f32_vec()?);
    let all = group.all_gather(&bytes)?;
    let mut logits = vec![0f32; rows * share * ranks];
    if !bytes.is_empty() {
        for (rank, theirs) in all.chunks_exact(bytes.len()).enumerate() {
            for (i, v) in wire::le_values(theirs).enumerate() {
                logits[(i / share) * share * ranks + rank * share + i % share] = v;
            }
        }
    }
    let logits = Array::from_slice_on(&logits, &[rows, share * ranks], part.device())?;
    Ok(logits.astype(part.dtype())?)
}

/// A seed rank 0 draws, the same on every rank: the random stream of a request that gives none,
/// so that every rank samples the same tokens.
pub(crate) fn seed_of_rank0(group: &Group) -> Result<u64> {
    let mut bytes = rand::random::<u64>().to_le_bytes();
    group.broadcast(0, &mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

//! How a pipeline's layers are shared out among the ranks.

use std::ops::Range;

use nuvec::distributed::Group;
use nuvec::Device;

use crate::{Error, Result};

/// The layers each rank of a pipeline runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Split {
    /// As even as the layers divide, the extra layers to the low ranks (mlx-lm's split).
    #[default]
    Even,
    /// How many layers each rank runs, rank 0 first (each at least one, summing to the model's).
    Layers(Vec<usize>),
    /// In proportion to each rank's free memory, which the ranks gather when the pipeline is
    /// made (the seed's `Split::memory()`).
    Memory,
}

impl Split {
    /// [`Split::Memory`]: stages sized by each rank's free memory.
    pub fn memory() -> Split {
        Split::Memory
    }

    /// Layers per rank, rank 0 first, for `layers` over `group`: as [`Split::counts`] says, a
    /// [`Split::Memory`] split from the free memory every rank reports. Given the checkpoint's
    /// `bytes`, each rank's share (its layers' part of them) is also checked against its free
    /// memory on every rank alike, so that a group too small for the model fails on every rank
    /// before any loads, naming the bytes. Every rank calls it (a gather, for those two).
    pub fn plan(&self, group: &Group, layers: usize, bytes: Option<u64>) -> Result<Vec<usize>> {
        let free = match (self, bytes) {
            (Split::Memory, _) | (_, Some(_)) => Some(free_memory(group)?),
            _ => None,
        };
        let counts = match (self, &free) {
            (Split::Memory, Some(free)) => by_memory(layers, free)?,
            _ => self.counts(layers, group.size())?,
        };
        if let (Some(bytes), Some(free)) = (bytes, &free) {
            let per_layer = bytes / layers.max(1) as u64;
            for (rank, (&n, &has)) in counts.iter().zip(free).enumerate() {
                let needs = per_layer * n as u64;
                if needs > has {
                    return Err(Error::Invalid(format!(
                        "rank {rank} would hold {n} of the {layers} layers, about {needs} bytes of the checkpoint's \
                         {bytes}, and has {has} bytes free: start more ranks, give it fewer layers \
                         (--pipeline-split), or split by memory (--pipeline-split memory)"
                    )));
                }
            }
        }
        Ok(counts)
    }

    /// Layers per rank, rank 0 first, for `layers` over `ranks`.
    pub fn counts(&self, layers: usize, ranks: usize) -> Result<Vec<usize>> {
        if ranks == 0 {
            return Err(Error::Invalid("a pipeline needs at least one rank".into()));
        }
        match self {
            Split::Even => {
                if layers < ranks {
                    return Err(Error::Invalid(format!(
                        "a model of {layers} layers cannot be split over {ranks} ranks: start at most {layers} ranks"
                    )));
                }
                let (base, extra) = (layers / ranks, layers % ranks);
                Ok((0..ranks).map(|r| base + usize::from(r < extra)).collect())
            }
            Split::Layers(counts) => {
                if counts.len() != ranks {
                    return Err(Error::Invalid(format!(
                        "the split {counts:?} gives {} ranks layers, and the group has {ranks}: give one count per rank",
                        counts.len()
                    )));
                }
                if counts.contains(&0) || counts.iter().sum::<usize>() != layers {
                    return Err(Error::Invalid(format!(
                        "the split {counts:?} must give every rank at least one layer and {layers} layers in all"
                    )));
                }
                Ok(counts.clone())
            }
            Split::Memory => Err(Error::Invalid(
                "Split::Memory shares the layers by the free memory the ranks report: plan it with the group \
                 (Split::plan)"
                    .into(),
            )),
        }
    }

    /// The layers of each rank, rank 0 first: rank `r` runs the layers after those of ranks
    /// `r + 1 ..`, so the highest rank runs the first layers and rank 0 the last (mlx-lm's order).
    pub fn ranges(&self, layers: usize, ranks: usize) -> Result<Vec<Range<usize>>> {
        Ok(ranges_of(&self.counts(layers, ranks)?))
    }

    /// Parses the CLI's form: `even`, `memory`, or the layer counts per rank, rank 0 first
    /// (`10,20`).
    pub fn parse(text: &str) -> Result<Split> {
        let text = text.trim();
        if text.is_empty() || text == "even" {
            return Ok(Split::Even);
        }
        if text == "memory" {
            return Ok(Split::Memory);
        }
        let counts =
            text.split(',').map(|c| c.trim().parse::<usize>()).collect::<std::result::Result<Vec<_>, _>>().map_err(
                |_| {
                    Error::Invalid(format!(
                        "--pipeline-split {text:?}: give `even`, `memory` or the layers of each rank, rank 0 first \
                         (as 10,20)"
                    ))
                },
            )?;
        Ok(Split::Layers(counts))
    }
}

/// The layers of each rank for `counts` per rank, rank 0 first ([`Split::ranges`]).
pub(crate) fn ranges_of(counts: &[usize]) -> Vec<Range<usize>> {
    let ranks = counts.len();
    (0..ranks)
        .map(|r| {
            let start: usize = counts[r + 1..].iter().sum();
            start..start + counts[r]
        })
        .collect()
}

/// The free host memory of every rank of `group`, rank 0 first.
fn free_memory(group: &Group) -> Result<Vec<u64>> {
    let mine = Device::Cpu.available_memory()? as u64;
    let all = group.all_gather(&mine.to_le_bytes())?;
    Ok(all.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("eight bytes"))).collect())
}

/// `layers` shared out in proportion to `free` (bytes per rank, rank 0 first): the largest
/// remainders take the layers left over, and every rank at least one.
fn by_memory(layers: usize, free: &[u64]) -> Result<Vec<usize>> {
    let ranks = free.len();
    if layers < ranks {
        return Err(Error::Invalid(format!(
            "a model of {layers} layers cannot be split over {ranks} ranks: start at most {layers} ranks"
        )));
    }
    let total: u128 = free.iter().map(|&f| u128::from(f)).sum::<u128>().max(1);
    let share = |f: u64| u128::from(f) * layers as u128;
    let mut counts: Vec<usize> = free.iter().map(|&f| (share(f) / total) as usize).collect();
    let mut order: Vec<usize> = (0..ranks).collect();
    order.sort_by_key(|&r| std::cmp::Reverse(share(free[r]) % total));
    let left = layers - counts.iter().sum::<usize>();
    for &r in order.iter().cycle().take(left) {
        counts[r] += 1;
    }
    while let Some(empty) = counts.iter().position(|&c| c == 0) {
        let most = (0..ranks).max_by_key(|&r| counts[r]).expect("ranks");
        counts[most] -= 1;
        counts[empty] = 1;
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_shares_layers_in_proportion_every_rank_at_least_one() {
        let gib = 1u64 << 30;
        assert_eq!(by_memory(8, &[30 * gib, 10 * gib]).unwrap(), [6, 2]);
        assert_eq!(by_memory(10, &[gib, gib, gib]).unwrap(), [4, 3, 3]);
        assert_eq!(by_memory(30, &[gib, 2 * gib]).unwrap(), [10, 20]);
        assert_eq!(by_memory(4, &[100 * gib, 0, 1]).unwrap(), [2, 1, 1]);
        assert_eq!(by_memory(3, &[0, 0, 0]).unwrap(), [1, 1, 1]);
        assert!(by_memory(2, &[gib, gib, gib]).unwrap_err().to_string().contains("2 layers"));
        // A group of one plans alone; a checkpoint larger than the machine's free memory is
        // refused before any loads.
        let one = Group::alone();
        assert_eq!(Split::Memory.plan(&one, 7, None).unwrap(), [7]);
        assert_eq!(Split::Even.plan(&one, 7, Some(1 << 20)).unwrap(), [7]);
        let e = Split::Even.plan(&one, 7, Some(u64::MAX / 2)).unwrap_err().to_string();
        assert!(e.contains("rank 0 would hold 7 of the 7 layers") && e.contains("bytes free"), "{e}");
    }

    #[test]
    fn even_gives_the_extra_layers_to_the_low_ranks_and_the_first_layers_to_the_high_ones() {
        assert_eq!(Split::Even.counts(30, 4).unwrap(), [8, 8, 7, 7]);
        assert_eq!(Split::Even.ranges(30, 4).unwrap(), [22..30, 14..22, 7..14, 0..7]);
        assert_eq!(Split::Even.ranges(5, 1).unwrap(), vec![0..5]);
        let e = Split::Even.counts(2, 3).unwrap_err().to_string();
        assert!(e.contains("2 layers cannot be split over 3 ranks"), "{e}");
    }

    #[test]
    fn layer_counts_are_checked_against_the_group_and_the_model() {
        assert_eq!(Split::Layers(vec![1, 3]).ranges(4, 2).unwrap(), [3..4, 0..3]);
        for (counts, ranks, words) in [
            (vec![1, 3], 3, "one count per rank"),
            (vec![0, 4], 2, "at least one layer"),
            (vec![2, 3], 2, "4 layers in all"),
        ] {
            let e = Split::Layers(counts).counts(4, ranks).unwrap_err().to_string();
            assert!(e.contains(words), "{e}");
        }
        assert_eq!(Split::parse("even").unwrap(), Split::Even);
        assert_eq!(Split::parse("memory").unwrap(), Split::memory());
        assert!(Split::Memory.counts(4, 2).unwrap_err().to_string().contains("Split::plan"));
        assert_eq!(Split::parse(" 10, 20 ").unwrap(), Split::Layers(vec![10, 20]));
        assert!(Split::parse("10;20").unwrap_err().to_string().contains("rank 0 first"));
    }
}

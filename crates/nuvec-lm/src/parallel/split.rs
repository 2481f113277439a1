//! How a pipeline's layers are shared out among the ranks.

use std::ops::Range;

use crate::{Error, Result};

/// The layers each rank of a pipeline runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Split {
    /// As even as the layers divide, the extra layers to the low ranks (mlx-lm's split).
    #[default]
    Even,
    /// How many layers each rank runs, rank 0 first (each at least one, summing to the model's).
    Layers(Vec<usize>),
}

impl Split {
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
        }
    }

    /// The layers of each rank, rank 0 first: rank `r` runs the layers after those of ranks
    /// `r + 1 ..`, so the highest rank runs the first layers and rank 0 the last (mlx-lm's order).
    pub fn ranges(&self, layers: usize, ranks: usize) -> Result<Vec<Range<usize>>> {
        let counts = self.counts(layers, ranks)?;
        Ok((0..ranks)
            .map(|r| {
                let start: usize = counts[r + 1..].iter().sum();
                start..start + counts[r]
            })
            .collect())
    }

    /// Parses the CLI's form: `even`, or the layer counts per rank, rank 0 first (`10,20`).
    pub fn parse(text: &str) -> Result<Split> {
        let text = text.trim();
        if text.is_empty() || text == "even" {
            return Ok(Split::Even);
        }
        let counts =
            text.split(',').map(|c| c.trim().parse::<usize>()).collect::<std::result::Result<Vec<_>, _>>().map_err(
                |_| {
                    Error::Invalid(format!(
                        "--pipeline-split {text:?}: give `even` or the layers of each rank, rank 0 first (as 10,20)"
                    ))
                },
            )?;
        Ok(Split::Layers(counts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(Split::parse(" 10, 20 ").unwrap(), Split::Layers(vec![10, 20]));
        assert!(Split::parse("10;20").unwrap_err().to_string().contains("rank 0 first"));
    }
}

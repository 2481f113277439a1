//! Runs a step's work on the paged cache, keeping a failure to the requests that cause it: a
//! pass over several sequences that fails (the model step has put every cache back) is run
//! again one sequence at a time, so only a sequence that fails alone fails.

use std::collections::HashSet;

use nuvec::Array;

use crate::cache::paged::{PagedCache, SeqId};
use crate::models::Model;
use crate::{Error, Result};

/// What a step's pass gave: logits, and (when asked for) the final hidden states of every row.
pub(crate) type Rows = (Array, Option<Array>);

/// What a step's pass gave.
pub(crate) enum Outcome {
    /// One pass over all the work: logits `[rows, vocab]`, each sequence's rows (its `counts`)
    /// in order, and the hidden states of all its rows in order.
    Together(Rows),
    /// Run apart after a failed pass: each sequence's rows or its error.
    Apart(Vec<Result<Rows>>),
}

/// Runs `work` (each sequence's new tokens, and the positions it holds before them) on `paged`,
/// giving the logits of each sequence's last `counts[i]` rows, and with `hidden` the final hidden
/// states of every row. With `fed`, the items it names decode a token picked on the device
/// ([`PagedCache::step_fed`]: each `(item, row of picks)`). A sequence in `faults` fails its pass
/// before the model runs (the tests' injected failure).
pub(crate) fn run(
    model: &Model,
    paged: &mut PagedCache,
    work: &[(SeqId, &[u32], usize)],
    counts: &[usize],
    faults: &HashSet<SeqId>,
    hidden: bool,
    fed: Option<(&Array, &[(usize, usize)])>,
) -> Outcome {
    let pass = |paged: &mut PagedCache,
                items: &[(SeqId, &[u32], usize)],
                counts: &[usize],
                fed: Option<(&Array, &[(usize, usize)])>|
     -> Result<Rows> {
        if let Some((id, _, _)) = items.iter().find(|(id, _, _)| faults.contains(id)) {
            return Err(Error::Invalid(format!("injected failure of sequence {}", id.0)));
        }
        let rows: Vec<(SeqId, &[u32])> = items.iter().map(|&(id, t, _)| (id, t)).collect();
        match (hidden, fed) {
            (true, None) => paged.step_last_rows_hidden(model, &rows, counts).map(|(l, h)| (l, Some(h))),
            (false, None) => paged.step_last_rows(model, &rows, counts).map(|l| (l, None)),
            (false, Some((picks, fed))) => paged.step_fed(model, &rows, counts, picks, fed).map(|l| (l, None)),
            (true, Some(_)) => Err(Error::Unsupported("hidden states of a step fed picked tokens".into())),
        }
    };
    match pass(paged, work, counts, fed) {
        Ok(logits) => Outcome::Together(logits),
        Err(e) if work.len() == 1 => Outcome::Apart(vec![Err(e)]),
        Err(_) => Outcome::Apart(
            work.iter()
                .zip(counts)
                .enumerate()
                .map(|(i, (item, count))| {
                    // This item's fed token, as the one item of its own pass.
                    let mine: Vec<(usize, usize)> =
                        fed.map_or(vec![], |(_, f)| f.iter().filter(|&&(j, _)| j == i).map(|&(_, p)| (0, p)).collect());
                    let fed = fed.filter(|_| !mine.is_empty()).map(|(picks, _)| (picks, &mine[..]));
                    // A cache the failed pass could not put back is not run on again.
                    match paged.positions(item.0)? {
                        held if held == item.2 => {
                            pass(paged, std::slice::from_ref(item), std::slice::from_ref(count), fed)
                        }
                        held => Err(Error::Invalid(format!(
                            "sequence {} holds {held} positions after a failed step, not {}: its cache is lost",
                            item.0 .0, item.2
                        ))),
                    }
                })
                .collect(),
        ),
    }
}

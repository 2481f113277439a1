//! Which rows of a forward pass take which served adapter (per-request adapters, vLLM's "LoRA
//! modules"). A model loaded with [`crate::LoadOptions::served_adapters`] holds each adapter's
//! terms beside its projections; a step names each sequence's adapter
//! ([`crate::StepBatch::push_adapted`]), and while the model runs that step its projections
//! read the rows' choice from here: a pass-wide setting, like the compute dtype, rather than an
//! argument threaded through every family's layers.

use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;

/// A served adapter of a model: its index in [`crate::Model::adapter_names`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterId(pub usize);

/// Runs of consecutive rows that take one adapter, in row order, and how many rows the pass has
/// (rows outside every run take none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowAdapters {
    pub(crate) runs: Vec<(AdapterId, Range<usize>)>,
    pub(crate) rows: usize,
}

impl RowAdapters {
    /// From each sequence's `(rows, adapter)` in step order; `None` when no row takes one.
    pub(crate) fn from_sequences(seqs: impl Iterator<Item = (usize, Option<AdapterId>)>) -> Option<RowAdapters> {
        let mut runs: Vec<(AdapterId, Range<usize>)> = vec![];
        let mut at = 0;
        for (rows, adapter) in seqs {
            if let Some(id) = adapter {
                match runs.last_mut() {
                    Some((last, r)) if *last == id && r.end == at => r.end = at + rows,
                    _ => runs.push((id, at..at + rows)),
                }
            }
            at += rows;
        }
        (!runs.is_empty()).then_some(RowAdapters { runs, rows: at })
    }
}

thread_local! {
    static ACTIVE: RefCell<Option<Rc<RowAdapters>>> = const { RefCell::new(None) };
}

/// Runs `f` with `rows` as the pass's adapter choice (`None`: every row takes the base), put
/// back as it was afterwards, also when `f` panics.
pub(crate) fn with_rows<R>(rows: Option<RowAdapters>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Rc<RowAdapters>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            ACTIVE.with(|a| *a.borrow_mut() = before);
        }
    }
    let before = ACTIVE.with(|a| a.replace(rows.map(Rc::new)));
    let _restore = Restore(before);
    f()
}

/// The running pass's adapter choice, when any row takes an adapter.
pub(crate) fn active() -> Option<Rc<RowAdapters>> {
    ACTIVE.with(|a| a.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_with_one_adapter_are_one_run() {
        let a = Some(AdapterId(0));
        let b = Some(AdapterId(1));
        let r = RowAdapters::from_sequences([(3, a), (1, a), (2, None), (1, b), (4, a)].into_iter()).unwrap();
        assert_eq!(r.runs, vec![(AdapterId(0), 0..4), (AdapterId(1), 6..7), (AdapterId(0), 7..11)]);
        assert_eq!(r.rows, 11);
        assert_eq!(RowAdapters::from_sequences([(3, None)].into_iter()), None);
    }

    #[test]
    fn the_choice_is_put_back_after_the_pass() {
        let r = RowAdapters::from_sequences([(2, Some(AdapterId(0)))].into_iter());
        with_rows(r.clone(), || {
            assert_eq!(active().as_deref(), r.as_ref());
            with_rows(None, || assert!(active().is_none()));
            assert_eq!(active().as_deref(), r.as_ref());
        });
        assert!(active().is_none());
    }
}

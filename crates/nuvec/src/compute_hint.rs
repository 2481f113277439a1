//! The float type the model being run computes in, as a scoped hint to the backends.
//!
//! mlx-lm computes a checkpoint in its own float type: f32 weights (or f32 quantization scales)
//! in f32, bf16 or f16 ones in half precision. A weight product can tell from its weight, but
//! attention has no weight: its inputs are f32 activations whatever the checkpoint. The model's
//! forward pass therefore says which type it computes in with [`with_compute_dtype`], for the
//! duration of that call on that thread (ops are issued from the thread that runs the model), and
//! a backend that can trade precision for speed reads it with [`compute_dtype_hint`]. The CUDA
//! backend's prefill attention does so under `MatmulPrecision::Auto` (its default); the CPU
//! backend computes in f32 and ignores it. Nothing is process-wide: two models of different
//! types can run on two threads, and without a hint (an op called outside a model) the arrays'
//! own type, f32, is what counts.

use std::cell::Cell;

use crate::DType;

thread_local! {
    static HINT: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Runs `f` with `dtype` as this thread's compute-type hint, restoring the previous hint after
/// (also when `f` panics).
pub fn with_compute_dtype<R>(dtype: DType, f: impl FnOnce() -> R) -> R {
    /// Puts the previous hint back when dropped.
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            HINT.with(|h| h.set(self.0));
        }
    }
    let _restore = Restore(HINT.with(|h| h.replace(Some(dtype))));
    f()
}

/// The compute type the innermost [`with_compute_dtype`] of this thread gave, if any.
pub fn compute_dtype_hint() -> Option<DType> {
    HINT.with(|h| h.get())
}

/// Whether the hint asks for half precision (f16 or bf16): the model computes in it, so the
/// reference rounds its attention inputs too.
pub fn hint_is_half() -> bool {
    matches!(compute_dtype_hint(), Some(DType::F16 | DType::BF16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_is_scoped_and_nests() {
        assert_eq!(compute_dtype_hint(), None);
        assert!(!hint_is_half());
        let inner = with_compute_dtype(DType::BF16, || {
            assert_eq!(compute_dtype_hint(), Some(DType::BF16));
            assert!(hint_is_half());
            with_compute_dtype(DType::F32, || (compute_dtype_hint(), hint_is_half()))
        });
        assert_eq!(inner, (Some(DType::F32), false));
        assert_eq!(compute_dtype_hint(), None);
        assert!(with_compute_dtype(DType::F16, hint_is_half));
    }

    #[test]
    fn the_hint_is_restored_after_a_panic() {
        let r = std::panic::catch_unwind(|| with_compute_dtype(DType::BF16, || panic!("inside")));
        assert!(r.is_err());
        assert_eq!(compute_dtype_hint(), None);
    }

    #[test]
    fn the_hint_is_per_thread() {
        with_compute_dtype(DType::BF16, || {
            let other = std::thread::spawn(compute_dtype_hint).join().unwrap();
            assert_eq!(other, None);
            assert_eq!(compute_dtype_hint(), Some(DType::BF16));
        });
    }
}

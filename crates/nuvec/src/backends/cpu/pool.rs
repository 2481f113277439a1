//! A small fork-join pool for the CPU kernels.
//!
//! Decode runs a few hundred short parallel regions per token (tens of microseconds each), where
//! waking sleeping threads (rayon's idle workers park on futexes) costs as much as the work. Here
//! the workers spin for a short while after each region, so the next one starts within
//! nanoseconds, and park only when the process is idle. Tasks are claimed dynamically from one
//! counter, so uneven tasks balance.
//!
//! A region submitted while another is running (another thread, or nested inside a task) runs
//! on the calling thread alone: always correct, never a deadlock.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker waits (spinning, then yielding) before it parks.
const SPIN: Duration = Duration::from_millis(2);

/// Busy-wait rounds before a waiting thread starts yielding its core (tens of microseconds).
const SPIN_ROUNDS: u32 = 1 << 10;

/// A wait for another thread of the pool: it spins first, as the wait is usually shorter than a
/// context switch, then yields its core at every round. On a machine with more runnable threads
/// than cores (a build or a browser beside the model) the thread being waited for may not be
/// running at all; a thread that kept spinning would hold the core it needs for its whole time
/// slice, and every parallel region would last a scheduler tick.
struct Backoff(u32);

impl Backoff {
    fn new() -> Self {
        Backoff(0)
    }

    fn snooze(&mut self) {
        if self.0 < SPIN_ROUNDS {
            self.0 += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }

    fn yielding(&self) -> bool {
        self.0 >= SPIN_ROUNDS
    }
}

/// Threads requested before the pool starts (0: all cores).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

type Job = &'static (dyn Fn(usize) + Sync);

struct Shared {
    generation: AtomicU64,
    job: UnsafeCell<Option<Job>>,
    tasks: AtomicUsize,
    next: AtomicUsize,
    active: AtomicUsize,
    panicked: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    submit: Mutex<()>,
    workers: usize,
}

// SAFETY: `job` is written only by the thread holding `submit` while no worker is inside a region
// (`active == 0`), and read by workers only after they observe the generation bump that follows
// the write (Release/Acquire), until they decrement `active`.
unsafe impl Sync for Shared {}

thread_local! {
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

static POOL: OnceLock<&'static Shared> = OnceLock::new();

fn pool() -> &'static Shared {
    POOL.get_or_init(|| {
        let threads = match REQUESTED.load(SeqCst) {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            submit: Mutex::new(()),
            workers: threads.saturating_sub(1),
        }));
        for i in 0..shared.workers {
            let spawned = std::thread::Builder::new().name(format!("nuvec-cpu-{i}")).spawn(move || worker(shared));
            if spawned.is_err() {
                // Without all its workers the pool would wait forever: run everything inline.
                if let Ok(guard) = shared.submit.lock() {
                    std::mem::forget(guard);
                }
                break;
            }
        }
        shared
    })
}

/// Sets the pool's size (calling thread included); false if the pool has already started.
pub(crate) fn set_threads(n: usize) -> bool {
    REQUESTED.store(n, SeqCst);
    POOL.get().is_none()
}

/// Threads a region runs on.
pub(crate) fn threads() -> usize {
    pool().workers + 1
}

fn run_tasks(shared: &Shared, job: Job) {
    let n = shared.tasks.load(Acquire);
    loop {
        let i = shared.next.fetch_add(1, AcqRel);
        if i >= n {
            break;
        }
        if catch_unwind(AssertUnwindSafe(|| job(i))).is_err() {
            shared.panicked.store(true, SeqCst);
        }
    }
}

fn worker(shared: &'static Shared) {
    IN_POOL.with(|f| f.set(true));
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut backoff = Backoff::new();
        loop {
            if shared.generation.load(Acquire) != seen {
                break;
            }
            if !backoff.yielding() || start.elapsed() < SPIN {
                backoff.snooze();
                continue;
            }
            let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.sleepers.fetch_add(1, SeqCst);
            while shared.generation.load(SeqCst) == seen {
                guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            shared.sleepers.fetch_sub(1, SeqCst);
            break;
        }
        seen = shared.generation.load(Acquire);
        // SAFETY: the generation bump we observed was published after `job` was written, and the
        // submitter keeps it (and what it borrows) alive until `active` drops to zero below.
        if let Some(job) = unsafe { *shared.job.get() } {
            run_tasks(shared, job);
        }
        shared.active.fetch_sub(1, Release);
    }
}

/// Runs `f(0) .. f(tasks - 1)` across the pool (the calling thread included) and returns when all
/// have finished. Panics if a task panicked.
pub(crate) fn run(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    if tasks == 0 {
        return;
    }
    let shared = pool();
    let guard = if tasks > 1 && shared.workers > 0 && !IN_POOL.with(|c| c.get()) {
        shared.submit.try_lock().ok()
    } else {
        None
    };
    let Some(_guard) = guard else {
        (0..tasks).for_each(f);
        return;
    };
    // SAFETY: the 'static lifetime never escapes this call: workers drop the reference before
    // they decrement `active`, and this function waits for `active == 0` before returning.
    let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
    // SAFETY: we hold `submit` and no region is active (the previous one ended with active == 0).
    unsafe { *shared.job.get() = Some(job) };
    shared.tasks.store(tasks, Release);
    shared.next.store(0, Release);
    shared.panicked.store(false, SeqCst);
    shared.active.store(shared.workers, SeqCst);
    shared.generation.fetch_add(1, SeqCst);
    if shared.sleepers.load(SeqCst) > 0 {
        let _l = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        shared.wake.notify_all();
    }
    IN_POOL.with(|c| c.set(true));
    run_tasks(shared, job);
    IN_POOL.with(|c| c.set(false));
    let mut backoff = Backoff::new();
    while shared.active.load(Acquire) != 0 {
        backoff.snooze();
    }
    // SAFETY: every worker has left the region (active == 0).
    unsafe { *shared.job.get() = None };
    if shared.panicked.load(SeqCst) {
        panic!("a CPU kernel task panicked");
    }
}

/// A raw pointer that may cross threads; users guarantee disjoint accesses.
pub(crate) struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used to hand disjoint regions of one live buffer to tasks that all finish before
// the buffer is used again.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

/// `f(first_index, chunk)` for each `chunk`-sized piece of `out`, across the pool.
pub(crate) fn for_chunks<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let (n, chunk) = (out.len(), chunk.max(1));
    let ptr = SendPtr(out.as_mut_ptr());
    run(n.div_ceil(chunk), &|t| {
        let start = t * chunk;
        let len = chunk.min(n - start);
        let p = ptr;
        // SAFETY: task t owns elements start..start + len of `out`, disjoint from every other
        // task's, and `out` outlives the region.
        let piece = unsafe { std::slice::from_raw_parts_mut(p.0.add(start), len) };
        f(start, piece)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_runs_every_task_once_even_nested_and_concurrent() {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    for n in [1usize, 2, 7, 100] {
                        let mut out = vec![0usize; n * 3];
                        for_chunks(&mut out, 3, |start, c| {
                            let mut inner = [0usize; 4];
                            for_chunks(&mut inner, 1, |i, c| c[0] = i);
                            for (j, v) in c.iter_mut().enumerate() {
                                *v = start + j + inner[3] - 3;
                            }
                        });
                        assert_eq!(out, (0..n * 3).collect::<Vec<_>>());
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}

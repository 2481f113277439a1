//! The MPI transport: one thread of the process makes every MPI call (MPI started there, in
//! funneled mode), so that a caller can stop waiting when the group's timeout passes while the
//! MPI call it started keeps its buffers on that thread. Calls poll their requests with a
//! backoff instead of blocking in MPI, whose blocking calls spin a core that the rank's own
//! compute threads need.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mpi::collective::SystemOperation;
use mpi::environment::Threading;
use mpi::point_to_point::MatchedReceiveVec;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::Exchange;
use crate::{Error, Result};

/// An exchange with its buffers owned, as the MPI thread runs it.
enum Work {
    Send { to: usize, bytes: Vec<u8> },
    Recv { from: usize },
    Broadcast { root: usize, bytes: Vec<u8> },
    AllReduceSum { values: Vec<f32> },
    AllGather { bytes: Vec<u8> },
    Barrier,
}

enum Outcome {
    Bytes(Vec<u8>),
    Values(Vec<f32>),
    Done,
}

struct Job {
    work: Work,
    reply: mpsc::SyncSender<Outcome>,
}

/// The MPI thread and the way to it.
pub(super) struct MpiLink {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// A call gave up waiting: the thread may never finish it, so it is not joined.
    stuck: AtomicBool,
}

impl MpiLink {
    /// Starts MPI on its own thread: the link, this process's rank and the world's size.
    pub(super) fn start() -> Result<(MpiLink, usize, usize)> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready, started) = mpsc::channel::<std::result::Result<(usize, usize), String>>();
        let worker = std::thread::Builder::new()
            .name("nuvec-mpi".into())
            .spawn(move || {
                let Some((universe, _)) = mpi::initialize_with_threading(Threading::Funneled) else {
                    let _ = ready.send(Err("MPI was already started and finished in this process".into()));
                    return;
                };
                let world = universe.world();
                let _ = ready.send(Ok((world.rank() as usize, world.size() as usize)));
                for job in queue {
                    let outcome = perform(&world, job.work);
                    // A caller that gave up waiting has dropped its end: nothing to tell.
                    let _ = job.reply.send(outcome);
                }
                // Dropping the universe finalizes MPI, on the thread that started it.
                drop(universe);
            })
            .map_err(|e| Error::Distributed(format!("could not start the MPI thread: {e}")))?;
        let (rank, size) = started
            .recv()
            .map_err(|_| Error::Distributed("MPI failed to start (the MPI thread ended)".into()))?
            .map_err(Error::Distributed)?;
        let link =
            MpiLink { jobs: Mutex::new(Some(jobs)), worker: Mutex::new(Some(worker)), stuck: AtomicBool::new(false) };
        Ok((link, rank, size))
    }

    /// Runs `exchange` on the MPI thread, waiting at most `timeout` for it.
    pub(super) fn run(&self, exchange: Exchange, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let work = match &exchange {
            Exchange::Send { to, bytes } => Work::Send { to: *to, bytes: bytes.to_vec() },
            Exchange::Recv { from } => Work::Recv { from: *from },
            Exchange::Broadcast { root, bytes } => Work::Broadcast { root: *root, bytes: bytes.to_vec() },
            Exchange::AllReduceSum { values } => Work::AllReduceSum { values: values.to_vec() },
            Exchange::AllGather { bytes } => Work::AllGather { bytes: bytes.to_vec() },
            Exchange::Barrier => Work::Barrier,
        };
        let (reply, answer) = mpsc::sync_channel(1);
        let stopped = || Error::Distributed("the MPI thread has stopped".into());
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.as_ref().ok_or_else(stopped)?.send(Job { work, reply }).map_err(|_| stopped())?;
        drop(jobs);
        let outcome = match answer.recv_timeout(timeout) {
            Ok(outcome) => outcome,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.stuck.store(true, Ordering::Relaxed);
                let who = match &exchange {
                    Exchange::Recv { from } => format!("rank {from} sent nothing"),
                    Exchange::Send { to, .. } => format!("rank {to} took nothing"),
                    _ => "not every rank joined".into(),
                };
                return Err(Error::Distributed(format!(
                    "{who} within {:.1} s: a rank has stopped, left, or is still busy (raise \
                     NUVEC_DISTRIBUTED_TIMEOUT if it is only slow)",
                    timeout.as_secs_f64()
                )));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(stopped()),
        };
        match (exchange, outcome) {
            (Exchange::Broadcast { bytes, .. }, Outcome::Bytes(b)) => bytes.copy_from_slice(&b),
            (Exchange::AllReduceSum { values }, Outcome::Values(v)) => values.copy_from_slice(&v),
            (Exchange::Recv { .. } | Exchange::AllGather { .. }, Outcome::Bytes(b)) => return Ok(Some(b)),
            _ => {}
        }
        Ok(None)
    }
}

impl Drop for MpiLink {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop, which then finalizes MPI.
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if !self.stuck.load(Ordering::Relaxed) {
            if let Some(worker) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = worker.join();
            }
        }
    }
}

/// Waits between polls: a few yields, then sleeps growing to half a millisecond.
struct Backoff(u32);

impl Backoff {
    fn wait(&mut self) {
        self.0 += 1;
        match self.0 {
            0..=64 => std::thread::yield_now(),
            n => std::thread::sleep(Duration::from_micros(u64::from((n - 64).min(50)) * 10)),
        }
    }
}

/// Polls `request` until it completes.
fn complete<'a, D: ?Sized, S: Scope<'a>>(mut request: Request<'a, D, S>) {
    let mut idle = Backoff(0);
    loop {
        match request.test() {
            Ok(_) => return,
            Err(pending) => {
                request = pending;
                idle.wait();
            }
        }
    }
}

fn perform(world: &SimpleCommunicator, work: Work) -> Outcome {
    let rank = |r: usize| r as mpi::Rank;
    match work {
        Work::Send { to, bytes } => {
            let peer = world.process_at_rank(rank(to));
            mpi::request::scope(|scope| complete(peer.immediate_send(scope, &bytes[..])));
            Outcome::Done
        }
        Work::Recv { from } => {
            let peer = world.process_at_rank(rank(from));
            let mut idle = Backoff(0);
            loop {
                if let Some(message) = peer.immediate_matched_probe() {
                    return Outcome::Bytes(message.matched_receive_vec::<u8>().0);
                }
                idle.wait();
            }
        }
        Work::Broadcast { root, mut bytes } => {
            let root = world.process_at_rank(rank(root));
            mpi::request::scope(|scope| complete(root.immediate_broadcast_into(scope, &mut bytes[..])));
            Outcome::Bytes(bytes)
        }
        Work::AllReduceSum { values } => {
            let mut sum = vec![0f32; values.len()];
            mpi::request::scope(|scope| {
                complete(world.immediate_all_reduce_into(scope, &values[..], &mut sum[..], SystemOperation::sum()))
            });
            Outcome::Values(sum)
        }
        Work::AllGather { bytes } => {
            let mut all = vec![0u8; bytes.len() * world.size() as usize];
            mpi::request::scope(|scope| complete(world.immediate_all_gather_into(scope, &bytes[..], &mut all[..])));
            Outcome::Bytes(all)
        }
        Work::Barrier => {
            complete(world.immediate_barrier());
            Outcome::Done
        }
    }
}

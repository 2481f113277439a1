//! A process group: the ranks of one job, each a process, and the messages between them (send,
//! receive, broadcast, all-reduce, all-gather, barrier), every one bounded by a timeout.
//!
//! [`init`] joins the job the process was started in: `mpirun -n N program …` (Open MPI or any
//! MPI, through the `mpi` feature) gives each process its rank. A process started on its own is a
//! group of one, where every collective is a copy. What a rank waits for is bounded by the
//! group's timeout (`NUVEC_DISTRIBUTED_TIMEOUT`, 60 s by default; [`Group::with_timeout`]): a rank
//! that stops answering fails the waiting rank's call with an error naming it, and every later
//! call on that group fails at once with the same cause, so a job never hangs on a lost rank.
//!
//! GPUs exchange through NCCL in other runtimes; nuvec's groups move host memory only, which is
//! what the CPU ranks of a pipeline need. A GPU model is not split over ranks yet.

#[cfg(feature = "mpi")]
mod mpi_link;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::{Error, Result};

/// How long a rank waits for the others when `NUVEC_DISTRIBUTED_TIMEOUT` is unset.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The ranks of one job. Cloning shares the group (and its failure state).
#[derive(Clone)]
pub struct Group {
    shared: Arc<Shared>,
    timeout: Duration,
}

struct Shared {
    rank: usize,
    size: usize,
    link: Link,
    /// The first failure (a timeout, a rank that left): later calls fail with it.
    failed: Mutex<Option<String>>,
    /// One call at a time: every rank must issue the same calls in the same order.
    order: Mutex<()>,
}

enum Link {
    /// A process on its own.
    Alone,
    #[cfg(feature = "mpi")]
    Mpi(mpi_link::MpiLink),
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("rank", &self.rank()).field("size", &self.size()).finish()
    }
}

/// The live group of this process, so that a second [`init`] shares it (MPI starts once).
static LIVE: Mutex<Option<Weak<Shared>>> = Mutex::new(None);

/// The launcher's world size, when the process was started by one (Open MPI, MPICH/Hydra, PMIx).
fn launched_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]
        .iter()
        .find_map(|name| std::env::var(name).ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The timeout `NUVEC_DISTRIBUTED_TIMEOUT` sets (whole seconds, at least 1).
fn configured_timeout() -> Result<Duration> {
    match crate::tuning::env("NUVEC_DISTRIBUTED_TIMEOUT") {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(v) if v.is_empty() => Ok(DEFAULT_TIMEOUT),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(s) if s > 0 => Ok(Duration::from_secs(s)),
            _ => Err(Error::Setting(format!(
                "NUVEC_DISTRIBUTED_TIMEOUT={v:?} is not a number of seconds; give a whole number of at least 1"
            ))),
        },
    }
}

/// Joins the job this process was launched in (`mpirun -n N …`): its rank and size come from the
/// launcher. A process started on its own is a group of one, unless `strict`, which refuses it.
/// A process launched as one of several ranks by a build without the `mpi` feature is refused
/// whatever `strict` says: running alone, each rank would silently compute the whole job.
/// Called again while the group lives, it gives the same group.
pub fn init(strict: bool) -> Result<Group> {
    let timeout = configured_timeout()?;
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(shared) = live.as_ref().and_then(Weak::upgrade) {
        return Ok(Group { shared, timeout });
    }
    let launched = launched_size();
    let link = match launched {
        None if strict => {
            return Err(Error::Distributed(
                "this process was not started by a launcher: start every rank with `mpirun -n N …`".into(),
            ))
        }
        None => None,
        Some(_) => Some(open_launched()?),
    };
    let shared = Arc::new(match link {
        None => Shared::alone(),
        Some((rank, size, link)) => Shared { rank, size, link, failed: Mutex::new(None), order: Mutex::new(()) },
    });
    *live = Some(Arc::downgrade(&shared));
    Ok(Group { shared, timeout })
}

#[cfg(feature = "mpi")]
fn open_launched() -> Result<(usize, usize, Link)> {
    let (link, rank, size) = mpi_link::MpiLink::start()?;
    Ok((rank, size, Link::Mpi(link)))
}

#[cfg(not(feature = "mpi"))]
fn open_launched() -> Result<(usize, usize, Link)> {
    Err(Error::Distributed(format!(
        "this process was started as one of {} ranks, and this nuvec was built without MPI: rebuild with the \
         `mpi` feature (`cargo build --release --features nuvec-cli/mpi`, with Open MPI's libopenmpi-dev and \
         libclang-dev installed)",
        launched_size().unwrap_or(0)
    )))
}

impl Shared {
    fn alone() -> Shared {
        Shared { rank: 0, size: 1, link: Link::Alone, failed: Mutex::new(None), order: Mutex::new(()) }
    }
}

/// One exchange, as every rank issues it.
pub(crate) enum Exchange<'a> {
    Send { to: usize, bytes: &'a [u8] },
    Recv { from: usize },
    Broadcast { root: usize, bytes: &'a mut [u8] },
    AllReduceSum { values: &'a mut [f32] },
    AllGather { bytes: &'a [u8] },
    Barrier,
}

impl Exchange<'_> {
    /// The exchange in words, for errors.
    fn describe(&self, rank: usize) -> String {
        match self {
            Exchange::Send { to, bytes } => format!("rank {rank} sending {} bytes to rank {to}", bytes.len()),
            Exchange::Recv { from } => format!("rank {rank} waiting for a message from rank {from}"),
            Exchange::Broadcast { root, bytes } => {
                format!("rank {rank} in a broadcast of {} bytes from rank {root}", bytes.len())
            }
            Exchange::AllReduceSum { values } => format!("rank {rank} in an all-reduce of {} values", values.len()),
            Exchange::AllGather { bytes } => format!("rank {rank} in an all-gather of {} bytes", bytes.len()),
            Exchange::Barrier => format!("rank {rank} at a barrier"),
        }
    }
}

impl Group {
    /// A group of this process alone (rank 0 of 1), whatever launched it.
    pub fn alone() -> Group {
        Group { shared: Arc::new(Shared::alone()), timeout: DEFAULT_TIMEOUT }
    }

    /// This process's rank, from 0.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// How many ranks the job has.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// How long a call waits for the other ranks.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The group with calls waiting at most `timeout` (at least a millisecond).
    pub fn with_timeout(mut self, timeout: Duration) -> Group {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Sends `bytes` to rank `to`, which receives them with [`Group::recv`].
    pub fn send(&self, to: usize, bytes: &[u8]) -> Result<()> {
        self.peer(to, "send to")?;
        self.run(Exchange::Send { to, bytes }).map(drop)
    }

    /// Receives the next message rank `from` sent this rank.
    pub fn recv(&self, from: usize) -> Result<Vec<u8>> {
        self.peer(from, "receive from")?;
        Ok(self.run(Exchange::Recv { from })?.unwrap_or_default())
    }

    /// Rank `root`'s `bytes`, into every rank's `bytes` (the same length on every rank).
    pub fn broadcast(&self, root: usize, bytes: &mut [u8]) -> Result<()> {
        self.member(root, "broadcast from")?;
        self.run(Exchange::Broadcast { root, bytes }).map(drop)
    }

    /// The sum of every rank's `values`, into each rank's `values` (the same length on every rank).
    pub fn all_reduce_sum(&self, values: &mut [f32]) -> Result<()> {
        self.run(Exchange::AllReduceSum { values }).map(drop)
    }

    /// Every rank's `bytes` (the same length on every rank), concatenated in rank order.
    pub fn all_gather(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(self.run(Exchange::AllGather { bytes })?.unwrap_or_default())
    }

    /// Returns when every rank has reached it.
    pub fn barrier(&self) -> Result<()> {
        self.run(Exchange::Barrier).map(drop)
    }

    fn member(&self, rank: usize, what: &str) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::Distributed(format!(
                "{what} rank {rank}: the group has ranks 0 to {}",
                self.size() - 1
            )));
        }
        Ok(())
    }

    fn peer(&self, rank: usize, what: &str) -> Result<()> {
        self.member(rank, what)?;
        if rank == self.rank() {
            return Err(Error::Distributed(format!("{what} rank {rank}: that is this rank itself")));
        }
        Ok(())
    }

    /// Runs `exchange` within the timeout; the bytes a receive or gather brought.
    fn run(&self, exchange: Exchange) -> Result<Option<Vec<u8>>> {
        let _order = self.shared.order.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cause) = self.shared.failed.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Err(Error::Distributed(format!("the group failed earlier: {cause}")));
        }
        let described = exchange.describe(self.rank());
        let result = match &self.shared.link {
            Link::Alone => alone(exchange),
            #[cfg(feature = "mpi")]
            Link::Mpi(link) => link.run(exchange, self.timeout),
        };
        if let Err(Error::Distributed(cause)) = &result {
            let cause = format!("{described}: {cause}");
            *self.shared.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(cause.clone());
            return Err(Error::Distributed(cause));
        }
        result
    }
}

/// An exchange within a group of one.
fn alone(exchange: Exchange) -> Result<Option<Vec<u8>>> {
    match exchange {
        Exchange::Send { .. } | Exchange::Recv { .. } => {
            Err(Error::Distributed("a group of one rank has no peer to exchange with".into()))
        }
        Exchange::AllGather { bytes } => Ok(Some(bytes.to_vec())),
        Exchange::Broadcast { .. } | Exchange::AllReduceSum { .. } | Exchange::Barrier => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_of_one_copies_and_has_no_peer() {
        let g = Group::alone();
        assert_eq!((g.rank(), g.size()), (0, 1));
        let mut v = [1.5f32, -2.0];
        g.all_reduce_sum(&mut v).unwrap();
        assert_eq!(v, [1.5, -2.0]);
        assert_eq!(g.all_gather(b"abc").unwrap(), b"abc");
        let mut b = *b"xy";
        g.broadcast(0, &mut b).unwrap();
        assert_eq!(&b, b"xy");
        g.barrier().unwrap();
        let e = g.send(0, b"a").unwrap_err().to_string();
        assert!(e.contains("this rank itself"), "{e}");
        let e = g.recv(3).unwrap_err().to_string();
        assert!(e.contains("ranks 0 to 0"), "{e}");
        let e = g.broadcast(1, &mut b).unwrap_err().to_string();
        assert!(e.contains("broadcast from rank 1"), "{e}");
    }
}

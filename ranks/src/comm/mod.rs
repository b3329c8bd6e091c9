//! Layer (d) and (e): the communication thread. One per rank; it makes the transport (MPI is
//! initialized, used and finalized on it), never blocks in the transport, and is the only
//! thread that touches it. Workers and submitters talk to it through [`CommHandle`]: a
//! channel of [`Command`]s and an unpark when it sleeps. It completes send and receive nodes
//! by deciding their cells, which call the nodes' `Completer`s (a worker takes each
//! completion from its pool's queue; none polls).

mod engine;
pub(crate) mod run;
mod send;
mod shared;
pub(crate) mod stamps;
pub(crate) mod wire;

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

pub(crate) use engine::{Command, EngineConfig, Payload, StagedPayload};
pub(crate) use send::{Sent, SMALL_SEND};
pub(crate) use shared::ProgressSlot;

use crate::error::{Error, ErrorKind};
use crate::transport::Transport;
use engine::Engine;
use send::Sending;
use shared::SharedEngine;

/// Yield this long with nothing to do (after the spin, if any) before parking. A yield
/// returns at once on a core with nothing else to run; on a full one it hands the core to the
/// thread this one waits for.
const YIELD: Duration = Duration::from_millis(2);
/// The park of a comm thread that waits on the network (a message cannot wake it).
const PARK_BUSY: Duration = Duration::from_micros(100);
/// The park of a comm thread with nothing in flight (heartbeats, a peer's first message).
const PARK_IDLE: Duration = Duration::from_millis(1);
/// While workers look at the network, the thread still takes the engine this often for its
/// timers (heartbeats, peers' silence).
const TIMERS_EVERY: Duration = Duration::from_millis(1);

/// How the thread waits with work in flight and nothing to do: it spins (polls the transport
/// again at once) for `spin`, then yields for [`YIELD`], then parks; with nothing in flight it
/// parks at once. A spin costs what a yield costs when the thread has a core of its own, and
/// answers an arrival without a system call; where the rank's threads share cores it starves
/// the thread it waits for (an 8-byte edge was 3.4 times slower with a 50 µs spin on 2 shared
/// cores), so `RanksBuilder` spins only where cores are spare, unless told otherwise.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiting {
    pub(crate) spin: Duration,
    /// The core to pin the thread to (a core of its own), if any.
    pub(crate) core: Option<usize>,
}

struct Shared {
    parked: Arc<AtomicBool>,
    thread: Thread,
}

/// How workers, submitters and the runtime reach the communication thread.
#[derive(Clone)]
pub(crate) struct CommHandle {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    /// The window and the transport's direct handle (`send.rs`).
    sending: Arc<Sending>,
    /// Runs stamp their edges' hops (`RanksBuilder::stamp_edges`).
    pub(crate) stamps: bool,
}

impl std::fmt::Debug for CommHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommHandle").finish_non_exhaustive()
    }
}

impl CommHandle {
    /// Sends waiting for room in the window of sends in flight.
    pub(crate) fn sends_waiting(&self) -> usize {
        self.sending.window.queued()
    }

    /// Queues `cmd` and wakes the thread if it sleeps. A command sent after the thread ended is
    /// dropped (its run is then failed by whoever ended it).
    pub(crate) fn send(&self, cmd: Command) {
        let _ = self.tx.send(cmd);
        // Pairs with the thread's fence between announcing its park and its last look at the
        // channel: either it sees the command, or this sees `parked` and unparks it.
        fence(Ordering::SeqCst);
        if self.shared.parked.load(Ordering::SeqCst) {
            self.shared.thread.unpark();
        }
    }
}

/// The running thread: its handle, the join handle, and what it reported at start.
pub(crate) struct CommThread {
    pub(crate) handle: CommHandle,
    pub(crate) join: Mutex<Option<JoinHandle<bool>>>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// Each rank's host, as the transport found them (`Transport::hosts`).
    pub(crate) hosts: Vec<usize>,
}

/// Starts the communication thread (pinned to `waiting.core`, if given): `make` builds the
/// transport on it (MPI initializes there). Returns once the transport is up, or with its
/// error. Where the transport allows calls from any thread and `cfg.worker_polls`, the pool's
/// spin hook finds the engine in `progress` (`shared.rs`).
pub(crate) fn spawn<T, F>(
    name: String,
    make: F,
    cfg: EngineConfig,
    poisoned: Arc<AtomicBool>,
    waiting: Waiting,
    progress: ProgressSlot,
) -> Result<CommThread, Error>
where
    T: Transport + 'static,
    F: FnOnce() -> Result<T, Error> + Send + 'static,
{
    let stamps = cfg.stamps;
    let sending = Arc::new(Sending::new(cfg.send_window, cfg.max_message));
    let sending_here = sending.clone();
    let (tx, rx) = mpsc::channel::<Command>();
    let (up_tx, up_rx) = mpsc::channel::<Result<(usize, usize, Vec<usize>), Error>>();
    let parked = Arc::new(AtomicBool::new(false));
    let parked_here = parked.clone();
    let join = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            if let Some(id) = waiting.core {
                // A placement hint: an unpinned thread works too.
                core_affinity::set_for_current(core_affinity::CoreId { id });
            }
            // Every rank learns the hosts before anything is sent (a collective under MPI).
            let made = make().and_then(|mut t| t.hosts().map(|h| (t, h)));
            let (engine, hosts, any_thread) = match made {
                Ok((t, hosts)) => {
                    let any_thread = t.any_thread() && cfg.worker_polls;
                    (
                        Engine::new(t, cfg, poisoned, sending_here),
                        hosts,
                        any_thread,
                    )
                }
                Err(e) => {
                    let _ = up_tx.send(Err(e));
                    return false;
                }
            };
            let (rank, size) = (engine.rank(), engine.size());
            let shared = SharedEngine::new(engine);
            shared.share(&progress, any_thread);
            let _ = up_tx.send(Ok((rank, size, hosts)));
            let guard = AbortOnUnwind(rank);
            let poisoned = run_loop(&shared, rx, &parked_here, waiting.spin);
            std::mem::forget(guard);
            poisoned
        })
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidConfig,
                format!("cannot start the communication thread: {e}"),
            )
        })?;
    let thread = join.thread().clone();
    let (rank, size, hosts) = match up_rx.recv() {
        Ok(Ok(rs)) => rs,
        Ok(Err(e)) => {
            let _ = join.join();
            return Err(e);
        }
        Err(_) => {
            let _ = join.join();
            return Err(Error::new(
                ErrorKind::Transport,
                "the communication thread ended while making its transport",
            ));
        }
    };
    Ok(CommThread {
        handle: CommHandle {
            tx,
            shared: Arc::new(Shared { parked, thread }),
            sending,
            stamps,
        },
        join: Mutex::new(Some(join)),
        rank,
        size,
        hosts,
    })
}

/// Aborts the process if the engine's holder unwinds (the communication thread, or a worker
/// looking at the network): its state (the transport, every run's cells) cannot be trusted
/// after a panic, and a rank that quietly lost its thread would hang every other rank.
/// Aborting makes the launcher end the job, or the others see it die.
struct AbortOnUnwind(usize);

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!(
            "boundpool-ranks: rank {}: the communication engine panicked; aborting",
            self.0
        );
        std::process::abort();
    }
}

/// The thread's loop: commands, arrivals, completions, timers; spins, yields, then parks when
/// there is nothing to do (see [`Waiting`]). While workers look at the network (`shared.rs`)
/// it leaves arrivals to them, and takes the engine only for commands and, every
/// [`TIMERS_EVERY`], its timers. Returns whether the runtime was poisoned (a dead peer or a
/// failed transport: the pool may have runs that never end).
fn run_loop<T: Transport + 'static>(
    shared: &SharedEngine<T>,
    rx: mpsc::Receiver<Command>,
    parked: &AtomicBool,
    spin: Duration,
) -> bool {
    let mut idle_since: Option<Instant> = None;
    let mut disconnected = false;
    let mut commands: Vec<Command> = Vec::new();
    let mut timers_at = Instant::now();
    let (mut busy, mut bulk) = (false, false);
    loop {
        take_commands(&rx, &mut commands, &mut disconnected);
        let looking = shared.workers_looking();
        let mut worked = !commands.is_empty();
        if worked || !looking || timers_at.elapsed() >= TIMERS_EVERY {
            let mut g = shared.lock();
            let engine = g.as_mut().expect("the engine until this thread closes it");
            for cmd in commands.drain(..) {
                engine.command(cmd);
            }
            if !looking {
                worked |= engine.probe(64) > 0;
                worked |= engine.poll() > 0;
            }
            engine.timers();
            timers_at = Instant::now();
            if engine.finished() {
                let engine = g.take().expect("the engine until this thread closes it");
                drop(g);
                return (*engine).close();
            }
            (busy, bulk) = (engine.busy(), engine.moving_bulk());
        }
        if worked {
            idle_since = None;
            continue;
        }
        if looking {
            // Traffic the workers take is traffic: the thread stays ready (spinning, then
            // yielding) to take arrivals again the moment the workers park.
            idle_since = None;
        }
        let idle = idle_since.get_or_insert_with(Instant::now).elapsed();
        match next_wait(busy, bulk, idle, spin) {
            Wait::Spin => std::hint::spin_loop(),
            Wait::Yield => std::thread::yield_now(),
            Wait::Park(d) => commands.extend(park(&rx, parked, d)),
        }
    }
}

/// Takes up to 256 queued commands into `into`; a disconnected channel (the runtime dropped
/// without its shutdown) becomes one shutdown.
fn take_commands(rx: &mpsc::Receiver<Command>, into: &mut Vec<Command>, disconnected: &mut bool) {
    for _ in 0..256 {
        match rx.try_recv() {
            Ok(cmd) => into.push(cmd),
            Err(mpsc::TryRecvError::Empty) => break,
            Err(mpsc::TryRecvError::Disconnected) => {
                if !*disconnected {
                    *disconnected = true;
                    into.push(Command::Shutdown { died: None });
                }
                break;
            }
        }
    }
}

/// How the thread waits for its next look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    Spin,
    Yield,
    Park(Duration),
}

/// The wait after `idle` with nothing done (see [`Waiting`]). While a long message moves
/// (`bulk`), the thread never parks: MPI moves one only as it is polled (a 64 MiB message
/// took 88 ms where polled without parks it takes about 10), and a yield still hands a shared
/// core over.
fn next_wait(busy: bool, bulk: bool, idle: Duration, spin: Duration) -> Wait {
    if busy && idle < spin {
        Wait::Spin
    } else if busy && (bulk || idle < spin + YIELD) {
        Wait::Yield
    } else if busy {
        Wait::Park(PARK_BUSY)
    } else {
        Wait::Park(PARK_IDLE)
    }
}

/// Parks for at most `d`, unless a command is queued (returned, for the loop to handle).
fn park(rx: &mpsc::Receiver<Command>, parked: &AtomicBool, d: Duration) -> Option<Command> {
    parked.store(true, Ordering::SeqCst);
    // Pairs with `CommHandle::send`'s fence: a command queued before it is seen below.
    fence(Ordering::SeqCst);
    let cmd = match rx.try_recv() {
        Ok(cmd) => Some(cmd),
        Err(_) => {
            std::thread::park_timeout(d);
            None
        }
    };
    parked.store(false, Ordering::SeqCst);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_spins_then_yields_then_parks_and_never_parks_while_a_long_message_moves() {
        let spin = Duration::from_micros(100);
        let us = Duration::from_micros;
        assert_eq!(next_wait(true, false, us(50), spin), Wait::Spin);
        assert_eq!(next_wait(true, false, us(500), spin), Wait::Yield);
        assert_eq!(
            next_wait(true, false, spin + YIELD, spin),
            Wait::Park(PARK_BUSY)
        );
        assert_eq!(next_wait(true, true, us(50), spin), Wait::Spin);
        assert_eq!(
            next_wait(true, true, Duration::from_secs(1), spin),
            Wait::Yield
        );
        assert_eq!(next_wait(false, false, us(0), spin), Wait::Park(PARK_IDLE));
        assert_eq!(
            next_wait(true, false, us(0), Duration::ZERO),
            Wait::Yield,
            "no spin where cores are shared"
        );
    }
}

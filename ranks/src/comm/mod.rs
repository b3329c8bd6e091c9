//! Layer (d) and (e): the communication thread. One per rank; it makes the transport (MPI is
//! initialized, used and finalized on it), never blocks in the transport, and is the only
//! thread that touches it. Workers and submitters talk to it through [`CommHandle`]: a
//! channel of [`Command`]s and an unpark when it sleeps. It completes send and receive nodes
//! by writing their cells, which the nodes' deferred completions poll.

mod engine;
pub(crate) mod run;
pub(crate) mod wire;

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

pub(crate) use engine::{Command, EngineConfig, Payload, StagedPayload};

use crate::error::{Error, ErrorKind};
use crate::transport::Transport;
use engine::Engine;

/// Yield this long with nothing to do before parking. A yield returns at once on a core with
/// nothing else to run (on a host with cores to spare it is a spin); on a full one it hands the
/// core to the thread this one waits for. Spinning instead (50 µs first) made an 8-byte edge
/// 3.4 times slower on 2 cores shared by two ranks' workers and communication threads.
const YIELD: Duration = Duration::from_millis(2);
/// The park of a comm thread that waits on the network (a message cannot wake it).
const PARK_BUSY: Duration = Duration::from_micros(100);
/// The park of a comm thread with nothing in flight (heartbeats, a peer's first message).
const PARK_IDLE: Duration = Duration::from_millis(1);

struct Shared {
    parked: Arc<AtomicBool>,
    thread: Thread,
}

/// How workers, submitters and the runtime reach the communication thread.
#[derive(Clone)]
pub(crate) struct CommHandle {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CommHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommHandle").finish_non_exhaustive()
    }
}

impl CommHandle {
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
}

/// Starts the communication thread: `make` builds the transport on it (MPI initializes there).
/// `notify` runs after the thread completes or fails cells (it wakes the workers). Returns
/// once the transport is up, or with its error.
pub(crate) fn spawn<T, F>(
    name: String,
    make: F,
    cfg: EngineConfig,
    poisoned: Arc<AtomicBool>,
    notify: Box<dyn Fn() + Send>,
) -> Result<CommThread, Error>
where
    T: Transport + 'static,
    F: FnOnce() -> Result<T, Error> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Command>();
    let (up_tx, up_rx) = mpsc::channel::<Result<(usize, usize), Error>>();
    let parked = Arc::new(AtomicBool::new(false));
    let parked_here = parked.clone();
    let join = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let engine = match make() {
                Ok(t) => Engine::new(t, cfg, poisoned),
                Err(e) => {
                    let _ = up_tx.send(Err(e));
                    return false;
                }
            };
            let _ = up_tx.send(Ok((engine.rank(), engine.size())));
            let guard = AbortOnUnwind(engine.rank());
            let poisoned = run_loop(engine, rx, &parked_here, &*notify);
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
    let (rank, size) = match up_rx.recv() {
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
        },
        join: Mutex::new(Some(join)),
        rank,
        size,
    })
}

/// Aborts the process if the communication thread unwinds: its state (the transport, every
/// run's cells) cannot be trusted after a panic, and a rank that quietly lost its thread would
/// hang every other rank. Aborting makes the launcher end the job, or the others see it die.
struct AbortOnUnwind(usize);

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!(
            "boundpool-ranks: rank {}: the communication thread panicked; aborting",
            self.0
        );
        std::process::abort();
    }
}

/// The thread's loop: commands, arrivals, completions, timers; yields, then parks when there
/// is nothing to do. Returns whether the runtime was poisoned (a dead peer or a
/// failed transport: the pool may have runs that never end).
fn run_loop<T: Transport>(
    mut engine: Engine<T>,
    rx: mpsc::Receiver<Command>,
    parked: &AtomicBool,
    notify: &dyn Fn(),
) -> bool {
    let mut idle_since: Option<Instant> = None;
    let mut disconnected = false;
    loop {
        let mut worked = false;
        for _ in 0..256 {
            match rx.try_recv() {
                Ok(cmd) => {
                    engine.command(cmd);
                    worked = true;
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    if !disconnected {
                        disconnected = true;
                        engine.command(Command::Shutdown { died: None });
                    }
                    break;
                }
            }
        }
        worked |= engine.probe(64) > 0;
        worked |= engine.poll() > 0;
        engine.timers();
        if engine.take_woke() {
            notify();
        }
        if engine.finished() {
            return engine.close();
        }
        if worked {
            idle_since = None;
            continue;
        }
        let idle = idle_since.get_or_insert_with(Instant::now).elapsed();
        if idle < YIELD && engine.busy() {
            std::thread::yield_now();
        } else {
            let d = if engine.busy() { PARK_BUSY } else { PARK_IDLE };
            park(&rx, parked, &mut engine, d);
        }
    }
}

/// Parks for at most `d`, unless a command is queued (taken and handled here).
fn park<T: Transport>(
    rx: &mpsc::Receiver<Command>,
    parked: &AtomicBool,
    engine: &mut Engine<T>,
    d: Duration,
) {
    parked.store(true, Ordering::SeqCst);
    // Pairs with `CommHandle::send`'s fence: a command queued before it is seen below.
    fence(Ordering::SeqCst);
    match rx.try_recv() {
        Ok(cmd) => engine.command(cmd),
        Err(_) => std::thread::park_timeout(d),
    }
    parked.store(false, Ordering::SeqCst);
}

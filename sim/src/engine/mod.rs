//! The discrete-event engine: every rank's lowered plan run in virtual time by its workers
//! (the shared work-taking policy over per-worker deques and group injectors), GPU streams
//! and the GPUs' SMs, the communication threads and the links' ports.
//!
//! Files: `setup.rs` (tasks from the lowering, costs sampled, the world), `worker.rs` (taking,
//! running and releasing nodes, waking, deferred completions), `gpu.rs` (streams, kernels),
//! `net.rs` (communication threads, paths, ports), `record.rs` (busy fractions, the critical
//! path, the trace), `fluid.rs` (shared cores and SMs). The work-taking order is the
//! scheduler's (`boundpool_scheduler::policy`).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use boundpool_ranks::Lowering;

use crate::error::SimResult;
use crate::graph::SimGraph;
use crate::machine::Machine;
use crate::report::SimReport;
use crate::CostModel;

mod fluid;
mod gpu;
mod net;
mod record;
mod setup;
mod worker;

pub(crate) use self::fluid::Fluid;
use self::fluid::{Demand, Owner};
use self::record::Recorder;

/// A task placed on no group: any worker of its rank may run it.
pub(crate) const ANY: u16 = u16::MAX;
/// The flag of a queued item that completes a deferred task instead of running one.
pub(crate) const COMPLETE: u32 = 1 << 31;
/// No task, worker, stream.
pub(crate) const NONE: u32 = u32::MAX;

/// What a task of a rank's lowered plan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// A node of the graph.
    Compute(u32),
    /// The send of transfer `t`.
    Send(u32),
    /// The receive of transfer `t`.
    Recv(u32),
}

/// How the transfers of a value to many ranks are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broadcast {
    /// The producer's rank sends to every consuming rank (`plan::lower` today).
    Flat,
    /// The consuming ranks forward it: the producer sends to `fanout` of them, each of those
    /// to `fanout` more (a `fanout`-ary tree over the consuming ranks in rank order).
    Tree {
        /// Children per rank in the tree.
        fanout: usize,
    },
    /// One copy per host: the producer's rank sends to one consuming rank of each other host
    /// (and to those of its own host), which forwards to the others of its host.
    PerHost,
}

/// How to simulate.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Seeds the cost samples and the workers' victim choices: the same seed gives the same
    /// run, event for event.
    pub seed: u64,
    /// Record a trace of the virtual run ([`SimReport::trace`]).
    pub trace: bool,
    /// How a value goes to several ranks.
    pub broadcast: Broadcast,
    /// Each port sends its waiting messages most urgent first, by the real lowering's
    /// `Transfer::priority` (the producer's longest path to the end), instead of in the
    /// order they came.
    pub send_priorities: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            seed: 1,
            trace: false,
            broadcast: Broadcast::Flat,
            send_priorities: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    /// A worker looks for work (woken, or after its body).
    Look(u32),
    /// A worker's body ends (a host with a core for every worker: no sharing).
    BodyDone(u32),
    /// A fluid resource's next action ends (host `h`, or GPU `hosts + g`), if still `version`.
    FluidDone(u32, u64),
    /// A worker's poll of its deferred completions ends.
    PollDone(u32),
    /// A stream's head kernel may start (its launch latency has passed).
    StreamCheck(u32),
    /// A deferred task's condition is met (device done, value arrived, send finished).
    DeferredReady(u32),
    /// A rank's communication thread finished its job.
    CommDone(u32),
    /// A port finished sending its message.
    PortFree(u32),
    /// A message may enter its next stage (its first chunk is through the previous one).
    StageEnter(u32),
    /// A message arrived at its rank.
    Arrive(u32),
    /// An arrived message is seen by its rank's communication thread.
    CommRecv(u32),
    /// An idle worker's spin (or deferred polling) ends, if still in that idle period.
    SpinEnd(u32, u64),
}

struct Entry {
    time: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    // Reversed: the heap pops the earliest, and of equal times the first scheduled.
    fn cmp(&self, o: &Self) -> Ordering {
        o.time.total_cmp(&self.time).then(o.seq.cmp(&self.seq))
    }
}

/// A worker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WState {
    /// Running a body, polling, or about to look (an event is scheduled).
    Busy,
    /// On its group's idle list (spinning, then parked).
    Idle,
}

pub(crate) struct Worker {
    pub(crate) rank: u32,
    pub(crate) group: u16,
    pub(crate) host: u32,
    pub(crate) deques: [VecDeque<u32>; 3],
    pub(crate) state: WState,
    pub(crate) idle_since: f64,
    pub(crate) takes: u32,
    pub(crate) rng: u64,
    pub(crate) deferred: Vec<u32>,
    pub(crate) running: u32,
    pub(crate) run_start: f64,
    /// The scheduling time before the running body (taking it, a steal).
    pub(crate) overhead: f64,
    pub(crate) stolen: bool,
    pub(crate) polling: Vec<u32>,
    /// Its streams: normal level, high level (GPU workers only).
    pub(crate) streams: [u32; 2],
    pub(crate) busy_s: f64,
}

pub(crate) enum CommJob {
    Send(u32),
    Recv(u32),
}

#[derive(Default)]
pub(crate) struct Comm {
    pub(crate) queue: VecDeque<CommJob>,
    pub(crate) current: Option<CommJob>,
    pub(crate) started: f64,
    pub(crate) busy: bool,
    pub(crate) last_active: f64,
    pub(crate) busy_s: f64,
}

pub(crate) struct RankState {
    /// `[level][group]` injectors.
    pub(crate) inj: [Vec<VecDeque<u32>>; 3],
    /// The pool-wide injector per level (unplaced sources).
    pub(crate) any: [VecDeque<u32>; 3],
    /// Global worker index range of each group.
    pub(crate) groups: Vec<(u32, u32)>,
    /// Idle workers per group (most recent last).
    pub(crate) idle: Vec<Vec<u32>>,
    pub(crate) prioritized: bool,
    pub(crate) left: usize,
    pub(crate) end: f64,
    pub(crate) comm: Comm,
}

pub(crate) struct Stream {
    pub(crate) gpu: u32,
    pub(crate) high: bool,
    pub(crate) worker: u32,
    pub(crate) queue: VecDeque<u32>,
    pub(crate) running: bool,
}

pub(crate) struct Stage {
    pub(crate) out: u32,
    pub(crate) inp: u32,
    pub(crate) bw: f64,
    pub(crate) lat: f64,
}

#[derive(Default)]
pub(crate) struct Msg {
    pub(crate) stages: Vec<Stage>,
    pub(crate) at: usize,
    pub(crate) prev_end: f64,
    pub(crate) prio: i64,
    pub(crate) queued: f64,
}

pub(crate) struct Port {
    pub(crate) name: String,
    pub(crate) busy: bool,
    pub(crate) queue: BinaryHeap<(i64, std::cmp::Reverse<u64>, u32)>,
    pub(crate) in_free: f64,
    pub(crate) busy_s: f64,
    pub(crate) bytes: f64,
}

/// The state of one simulation.
pub(crate) struct World<'a> {
    pub(crate) machine: &'a Machine,
    pub(crate) graph: &'a SimGraph,
    pub(crate) lowering: Lowering,
    /// Per transfer: the transfer whose received value it forwards (a broadcast tree).
    pub(crate) via: Vec<Option<u32>>,
    // Tasks: compute nodes, then sends, then receives.
    pub(crate) what: Vec<What>,
    pub(crate) rank_of: Vec<u32>,
    pub(crate) place: Vec<u16>,
    pub(crate) level: Vec<u8>,
    pub(crate) is_gpu: Vec<bool>,
    pub(crate) defer: Vec<bool>,
    pub(crate) host_s: Vec<f64>,
    pub(crate) dev_s: Vec<f64>,
    pub(crate) occ: Vec<f64>,
    /// Per task: its kind's interference (see `fluid.rs`).
    pub(crate) interference: Vec<f64>,
    pub(crate) succ_start: Vec<u32>,
    pub(crate) succ: Vec<u32>,
    pub(crate) indeg: Vec<u32>,
    pub(crate) dpred_start: Vec<u32>,
    pub(crate) dpred: Vec<u32>,
    pub(crate) bytes: Vec<f64>,
    /// Ports send by the lowering's `Transfer::priority` (else in arrival order).
    pub(crate) send_priorities: bool,
    // Run state per task.
    pub(crate) ready_flag: Vec<bool>,
    pub(crate) registered: Vec<u32>,
    pub(crate) dev_done: Vec<bool>,
    pub(crate) dev_left: Vec<u32>,
    pub(crate) dev_waiters: Vec<Vec<u32>>,
    pub(crate) handoff: Vec<u32>,
    pub(crate) stream_of: Vec<u32>,
    pub(crate) done: Vec<bool>,
    pub(crate) t: record::Times,
    // Resources.
    pub(crate) workers: Vec<Worker>,
    pub(crate) ranks: Vec<RankState>,
    pub(crate) streams: Vec<Stream>,
    pub(crate) hosts: Vec<Fluid>,
    pub(crate) host_ample: Vec<bool>,
    pub(crate) gpus: Vec<Fluid>,
    pub(crate) ports: Vec<Port>,
    pub(crate) port_ids: net::PortIds,
    pub(crate) msgs: Vec<Msg>,
    // The clock.
    heap: BinaryHeap<Entry>,
    seq: u64,
    pub(crate) now: f64,
    pub(crate) events: u64,
    pub(crate) rec: Recorder,
    pub(crate) tasks_done: usize,
    pub(crate) seq_ports: u64,
    // Idle workers watching the queues take a core without doing work (oversubscribed
    // hosts only).
    pub(crate) spin_on: Vec<bool>,
    pub(crate) spin_ver: Vec<u64>,
}

impl World<'_> {
    pub(crate) fn at(&mut self, time: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Entry {
            time: time.max(self.now),
            seq: self.seq,
            ev,
        });
    }

    pub(crate) fn tasks(&self) -> usize {
        self.what.len()
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Look(w) => self.look(w),
            Ev::BodyDone(w) => self.body_done(w),
            Ev::FluidDone(res, version) => self.fluid_done(res, version),
            Ev::PollDone(w) => self.poll_done(w),
            Ev::StreamCheck(s) => self.try_start_stream(s),
            Ev::DeferredReady(t) => self.deferred_ready(t),
            Ev::CommDone(r) => self.comm_done(r),
            Ev::PortFree(p) => self.port_free(p),
            Ev::StageEnter(m) => self.stage_enter(m),
            Ev::Arrive(m) => self.arrive(m),
            Ev::CommRecv(m) => self.comm_recv(m),
            Ev::SpinEnd(w, v) => {
                if self.spin_ver[w as usize] == v {
                    self.stop_spin(w as usize);
                }
            }
        }
    }

    /// Idle worker `w` takes a core for `secs` (on an oversubscribed host only).
    pub(crate) fn start_spin(&mut self, w: usize, secs: f64) {
        let host = self.workers[w].host as usize;
        if self.host_ample[host] {
            return;
        }
        self.spin_ver[w] += 1;
        if !self.spin_on[w] {
            self.spin_on[w] = true;
            self.fluid_add(
                host as u32,
                Owner::Spin(w as u32),
                f64::INFINITY,
                Demand::CORE,
            );
        }
        let v = self.spin_ver[w];
        self.at(self.now + secs, Ev::SpinEnd(w as u32, v));
    }

    pub(crate) fn stop_spin(&mut self, w: usize) {
        if self.spin_on[w] {
            self.spin_on[w] = false;
            self.spin_ver[w] += 1;
            let host = self.workers[w].host;
            self.fluid_remove(host, Owner::Spin(w as u32));
        }
    }

    fn fluid_remove(&mut self, host: u32, owner: Owner) {
        let fluid = &mut self.hosts[host as usize];
        let next = fluid.remove(self.now, owner);
        let v = fluid.version;
        if let Some(t) = next {
            self.at(t, Ev::FluidDone(host, v));
        }
    }

    fn fluid_done(&mut self, res: u32, version: u64) {
        let hosts = self.hosts.len() as u32;
        let fluid = if res < hosts {
            &mut self.hosts[res as usize]
        } else {
            &mut self.gpus[(res - hosts) as usize]
        };
        if fluid.version != version {
            return;
        }
        let mut done = Vec::new();
        let next = fluid.finish(self.now, &mut done);
        let v = fluid.version;
        if let Some(t) = next {
            self.at(t, Ev::FluidDone(res, v));
        }
        for owner in done {
            match owner {
                Owner::Worker(w) => self.body_done(w),
                Owner::Kernel(t) => self.kernel_done(t),
                Owner::Comm(r) => self.comm_done(r),
                Owner::Spin(_) => {}
            }
        }
    }

    /// Starts an action on host `h`'s cores or GPU `g` (`res` = hosts + g).
    pub(crate) fn fluid_add(&mut self, res: u32, owner: Owner, work: f64, demand: Demand) {
        let hosts = self.hosts.len() as u32;
        let fluid = if res < hosts {
            &mut self.hosts[res as usize]
        } else {
            &mut self.gpus[(res - hosts) as usize]
        };
        let next = fluid.add(self.now, owner, work, demand);
        let v = fluid.version;
        if let Some(t) = next {
            self.at(t, Ev::FluidDone(res, v));
        }
    }

    fn run(&mut self, progress: &mut dyn FnMut(usize, usize)) {
        self.start();
        let total = self.tasks();
        let mut last_report = 0usize;
        while let Some(e) = self.heap.pop() {
            self.now = e.time;
            self.events += 1;
            self.dispatch(e.ev);
            if self.tasks_done > last_report + total / 100 {
                last_report = self.tasks_done;
                progress(self.tasks_done, total);
            }
        }
        progress(self.tasks_done, total);
    }
}

/// Simulates one run of `graph` on `machine` with `costs`; `progress(done, total)` is called
/// as tasks complete.
pub(crate) fn simulate(
    graph: &SimGraph,
    machine: &Machine,
    costs: &CostModel,
    opts: &SimOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> SimResult<SimReport> {
    let mut w = setup::world(graph, machine, costs, opts)?;
    w.run(progress);
    w.report()
}

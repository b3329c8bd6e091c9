//! Workers in virtual time: looking for work with the scheduler's own policy
//! (`boundpool_scheduler::policy::find_task` over this file's queues), running bodies on their
//! host's cores, releasing successors (one continuation, the rest to the own deque or the
//! placement's injector, waking an idle peer), idling, and deferred completions.

use std::collections::VecDeque;

use boundpool_scheduler::Priority;

use super::fluid::{Demand, Owner};
use super::setup::{level_of, lvl};
use super::{Ev, RankState, WState, What, Worker, World, ANY, COMPLETE, NONE};
use crate::machine::Completion;
use boundpool_scheduler::policy::{find_task, Take, WorkerQueues};

/// crossbeam-deque's largest batch.
const MAX_BATCH: usize = 32;

/// One worker's view of its rank's queues, for the shared policy.
struct SimQueues<'w> {
    workers: &'w mut [Worker],
    rank: &'w mut RankState,
    me: usize,
    first: u32,
    count: u32,
    stolen: bool,
    batched: bool,
}

/// Moves a batch from the front of `from` (the first returned) into `to`, so that the oldest
/// of the rest is popped next (what `steal_batch_and_pop` leaves in a LIFO deque).
fn batch(from: &mut VecDeque<u32>, to: &mut VecDeque<u32>, size: usize) -> Option<u32> {
    let first = from.pop_front()?;
    let rest: Vec<u32> = (0..size.saturating_sub(1))
        .filter_map(|_| from.pop_front())
        .collect();
    to.extend(rest.into_iter().rev());
    Some(first)
}

impl WorkerQueues for SimQueues<'_> {
    type Task = u32;

    fn pop_own(&mut self, level: Priority) -> Option<u32> {
        self.workers[self.me].deques[lvl(level) as usize].pop_back()
    }

    fn take_group_injector(&mut self, level: Priority) -> Take<u32> {
        let l = lvl(level) as usize;
        let g = self.workers[self.me].group as usize;
        let inj = &mut self.rank.inj[l][g];
        let size = inj.len().div_ceil(2).min(MAX_BATCH);
        match batch(inj, &mut self.workers[self.me].deques[l], size) {
            Some(t) => {
                self.batched = true;
                Take::Task(t)
            }
            None => Take::Empty,
        }
    }

    fn domains(&self) -> usize {
        0
    }

    fn take_domain_injector(&mut self, _level: Priority, _d: usize) -> Take<u32> {
        Take::Empty
    }

    fn take_any_injector(&mut self, level: Priority) -> Take<u32> {
        let l = lvl(level) as usize;
        let inj = &mut self.rank.any[l];
        let size = inj.len().div_ceil(2).min(MAX_BATCH);
        match batch(inj, &mut self.workers[self.me].deques[l], size) {
            Some(t) => {
                self.batched = true;
                Take::Task(t)
            }
            None => Take::Empty,
        }
    }

    fn peers(&self) -> usize {
        self.count as usize
    }

    fn peer(&self, k: usize) -> usize {
        (self.first as usize) + k
    }

    fn me(&self) -> usize {
        self.me
    }

    fn next_rand(&mut self) -> usize {
        // xorshift64*, as the worker's victim choice.
        let w = &mut self.workers[self.me];
        let mut x = w.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        w.rng = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as usize
    }

    fn steal_from(&mut self, level: Priority, victim: usize) -> Take<u32> {
        let l = lvl(level) as usize;
        let mut stolen = std::mem::take(&mut self.workers[victim].deques[l]);
        let size = (stolen.len().saturating_sub(1) / 2).min(MAX_BATCH - 1) + 1;
        let got = batch(&mut stolen, &mut self.workers[self.me].deques[l], size);
        self.workers[victim].deques[l] = stolen;
        match got {
            Some(t) => {
                self.stolen = true;
                self.batched = true;
                Take::Task(t)
            }
            None => Take::Empty,
        }
    }
}

impl World<'_> {
    /// Queues every rank's sources, as a submission from outside the pool does.
    pub(crate) fn start(&mut self) {
        for t in 0..self.tasks() as u32 {
            if self.indeg[t as usize] == 0 {
                self.t.ready[t as usize] = 0.0;
                let (r, l) = (
                    self.rank_of[t as usize] as usize,
                    self.level[t as usize] as usize,
                );
                match self.place[t as usize] {
                    ANY => {
                        self.ranks[r].any[l].push_back(t);
                        self.notify_any(r);
                    }
                    g => {
                        self.ranks[r].inj[l][g as usize].push_back(t);
                        self.notify_group(r, g as usize);
                    }
                }
            }
        }
        for r in 0..self.ranks.len() {
            if self.ranks[r].left == 0 {
                self.ranks[r].end = 0.0;
            }
        }
    }

    /// How long idle worker `w` takes to see work or a completion now.
    fn wake_latency(&self, w: usize) -> f64 {
        let s = &self.machine.sched;
        let wk = &self.workers[w];
        let idle_for = self.now - wk.idle_since;
        if !wk.deferred.is_empty() {
            // Polling its deferred completions between yields, then in timed parks.
            if idle_for <= s.deferred_spin_s {
                0.0
            } else {
                s.deferred_park_s / 2.0
            }
        } else if idle_for <= s.spin_s {
            0.0
        } else {
            s.wake_s
        }
    }

    /// Makes idle worker `w` look for work after its wake-up latency.
    fn wake(&mut self, w: usize) {
        let latency = self.wake_latency(w);
        let wk = &mut self.workers[w];
        let (r, g) = (wk.rank as usize, wk.group as usize);
        wk.state = WState::Busy;
        let idle = &mut self.ranks[r].idle[g];
        if let Some(pos) = idle.iter().rposition(|&x| x as usize == w) {
            idle.remove(pos);
        }
        let since = self.workers[w].idle_since;
        self.rec.park(w as u32, since, self.now + latency);
        self.stop_spin(w);
        self.at(self.now + latency, Ev::Look(w as u32));
    }

    pub(crate) fn notify_group(&mut self, r: usize, g: usize) {
        if let Some(&w) = self.ranks[r].idle[g].last() {
            self.wake(w as usize);
        }
    }

    fn notify_any(&mut self, r: usize) {
        if let Some(g) = (0..self.ranks[r].idle.len()).find(|&g| !self.ranks[r].idle[g].is_empty())
        {
            self.notify_group(r, g);
        }
    }

    /// The shared policy's answer for worker `w`: a queued item and whether it was stolen.
    fn find(&mut self, w: usize) -> Option<(u32, bool)> {
        let (r, g) = (
            self.workers[w].rank as usize,
            self.workers[w].group as usize,
        );
        let (first, end) = self.ranks[r].groups[g];
        let prioritized = self.ranks[r].prioritized;
        let mut takes = self.workers[w].takes;
        let mut q = SimQueues {
            workers: &mut self.workers,
            rank: &mut self.ranks[r],
            me: w,
            first,
            count: end - first,
            stolen: false,
            batched: false,
        };
        let found = find_task(&mut q, prioritized, &mut takes);
        let (stolen, batched) = (q.stolen, q.batched);
        self.workers[w].takes = takes;
        if batched && self.workers[w].deques.iter().any(|d| !d.is_empty()) {
            // `share_surplus`: more than one task here, wake a peer.
            self.notify_group(r, g);
        }
        found.map(|t| (t, stolen))
    }

    pub(crate) fn look(&mut self, w: u32) {
        let wu = w as usize;
        if let Some((item, stolen)) = self.find(wu) {
            self.begin(wu, item, stolen);
            return;
        }
        if self.machine.sched.completion == Completion::WhenDry {
            let ready: Vec<u32> = self.workers[wu]
                .deferred
                .iter()
                .copied()
                .filter(|&t| self.ready_flag[t as usize])
                .collect();
            if !ready.is_empty() {
                // One poll round: every pending completion looked at.
                let cost = self.machine.sched.poll_s * self.workers[wu].deferred.len() as f64;
                let wk = &mut self.workers[wu];
                wk.deferred.retain(|t| !ready.contains(t));
                wk.polling = ready;
                self.at(self.now + cost, Ev::PollDone(w));
                return;
            }
        }
        let wk = &mut self.workers[wu];
        wk.state = WState::Idle;
        wk.idle_since = self.now;
        let (r, g) = (wk.rank as usize, wk.group as usize);
        // It watches the queues with `spin_loop` hints first (a core's worth of work); with
        // deferred completions it polls between yields, which take no share from a thread
        // that computes (measured on this kernel's EEVDF scheduler: crate docs).
        let watch = wk.deferred.is_empty();
        self.ranks[r].idle[g].push(w);
        if watch {
            self.start_spin(wu, self.machine.sched.spin_s);
        }
    }

    pub(crate) fn poll_done(&mut self, w: u32) {
        let list = std::mem::take(&mut self.workers[w as usize].polling);
        let mut cont = None;
        for t in list {
            self.t.seen[t as usize] = self.now;
            self.complete(w as usize, t, &mut cont);
        }
        match cont {
            Some(c) => self.begin(w as usize, c, false),
            None => self.look(w),
        }
    }

    /// Starts `item` on worker `w`: a task's body, or the completion of a deferred one.
    fn begin(&mut self, w: usize, item: u32, stolen: bool) {
        let s = &self.machine.sched;
        let overhead = s.node_s + if stolen { s.steal_s } else { 0.0 };
        let cost = if item & COMPLETE != 0 {
            s.node_s
        } else {
            let t = item as usize;
            self.t.start[t] = self.now;
            self.t.worker[t] = w as u32;
            overhead + self.host_s[t]
        };
        let wk = &mut self.workers[w];
        wk.state = WState::Busy;
        wk.running = item;
        wk.run_start = self.now;
        wk.overhead = overhead;
        wk.stolen = stolen;
        let host = wk.host as usize;
        if self.host_ample[host] {
            self.at(self.now + cost, Ev::BodyDone(w as u32));
        } else {
            self.fluid_add(host as u32, Owner::Worker(w as u32), cost, Demand::CORE);
        }
    }

    pub(crate) fn body_done(&mut self, w: u32) {
        let wu = w as usize;
        let item = self.workers[wu].running;
        self.workers[wu].running = NONE;
        let start = self.workers[wu].run_start;
        self.workers[wu].busy_s += self.now - start;
        let mut cont = None;
        if item & COMPLETE != 0 {
            let t = item & !COMPLETE;
            self.t.seen[t as usize] = self.now;
            self.complete(wu, t, &mut cont);
        } else {
            let t = item as usize;
            self.t.end[t] = self.now;
            self.rec
                .body(w, item, start, self.now, self.workers[wu].stolen);
            match self.what[t] {
                What::Compute(_) if self.is_gpu[t] => {
                    self.launch(wu, item);
                    if self.defer[t] {
                        self.register(wu, item);
                    } else {
                        self.complete(wu, item, &mut cont);
                    }
                }
                What::Compute(_) => self.complete(wu, item, &mut cont),
                What::Send(tr) => {
                    self.comm_send(tr);
                    self.register(wu, item);
                }
                What::Recv(_) => self.register(wu, item),
            }
        }
        match cont {
            Some(c) => self.begin(wu, c, false),
            None => self.look(w),
        }
    }

    /// Task `t` completed (its body ran, and its deferred condition, if any, was seen):
    /// releases its successors; the first that may run on `w` becomes `cont`.
    pub(crate) fn complete(&mut self, w: usize, t: u32, cont: &mut Option<u32>) {
        let tu = t as usize;
        self.done[tu] = true;
        self.t.done[tu] = self.now;
        self.tasks_done += 1;
        let r = self.rank_of[tu] as usize;
        self.ranks[r].left -= 1;
        if self.ranks[r].left == 0 {
            self.ranks[r].end = self.now;
        }
        let (a, b) = (
            self.succ_start[tu] as usize,
            self.succ_start[tu + 1] as usize,
        );
        for k in a..b {
            let s = self.succ[k];
            let su = s as usize;
            self.indeg[su] -= 1;
            if self.indeg[su] == 0 {
                self.t.ready[su] = self.now;
                self.t.cause[su] = t;
                self.handoff_stream(t, s, b - a);
                self.release(w, s, cont);
            }
        }
    }

    fn release(&mut self, w: usize, s: u32, cont: &mut Option<u32>) {
        let su = s as usize;
        let (r, g) = (self.workers[w].rank as usize, self.workers[w].group);
        let here = self.place[su] == ANY || self.place[su] == g;
        if here && cont.is_none() {
            *cont = Some(s);
            return;
        }
        let l = self.level[su] as usize;
        if here {
            self.workers[w].deques[l].push_back(s);
            self.notify_group(r, g as usize);
        } else {
            let pg = self.place[su] as usize;
            self.ranks[r].inj[l][pg].push_back(s);
            self.notify_group(r, pg);
        }
    }

    /// Registers worker `w` as the one that polls task `t`'s deferred completion.
    fn register(&mut self, w: usize, t: u32) {
        self.registered[t as usize] = w as u32;
        match self.machine.sched.completion {
            Completion::WhenDry => self.workers[w].deferred.push(t),
            Completion::AtOnce => {
                if self.ready_flag[t as usize] {
                    self.queue_completion(t);
                }
            }
        }
    }

    fn queue_completion(&mut self, t: u32) {
        let w = self.registered[t as usize] as usize;
        let (r, g) = (
            self.workers[w].rank as usize,
            self.workers[w].group as usize,
        );
        self.ranks[r].inj[lvl(level_of(1)) as usize][g].push_back(t | COMPLETE);
        self.notify_group(r, g);
    }

    /// Task `t`'s deferred condition is met now.
    pub(crate) fn deferred_ready(&mut self, t: u32) {
        self.ready_flag[t as usize] = true;
        self.t.cond[t as usize] = self.now;
        let w = self.registered[t as usize];
        if w == NONE {
            return;
        }
        match self.machine.sched.completion {
            Completion::AtOnce => self.queue_completion(t),
            Completion::WhenDry => {
                if self.workers[w as usize].state == WState::Idle {
                    self.wake(w as usize);
                }
            }
        }
    }
}

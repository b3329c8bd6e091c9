//! GPU work in virtual time: a GPU node's body enqueues its kernel on its worker's stream (of
//! its level, or one handed over), where it starts after the launch latency, the kernels
//! before it on the stream and its GPU predecessors' (event waits); kernels of all streams
//! share the GPU's SMs (`fluid.rs`).

use super::fluid::{Demand, Owner};
use super::{Ev, World, NONE};

impl World<'_> {
    /// A GPU node whose only successor is a GPU node of its level hands it its stream.
    pub(crate) fn handoff_stream(&mut self, t: u32, s: u32, successors: usize) {
        let handoff = self.machine.gpu.as_ref().is_some_and(|g| g.stream_handoff);
        let (tu, su) = (t as usize, s as usize);
        if handoff
            && successors == 1
            && self.is_gpu[tu]
            && self.is_gpu[su]
            && self.level[tu] == self.level[su]
            && self.stream_of[tu] != NONE
        {
            self.handoff[su] = self.stream_of[tu];
        }
    }

    /// Worker `w` enqueues task `t`'s kernel.
    pub(crate) fn launch(&mut self, w: usize, t: u32) {
        let tu = t as usize;
        let stream = if self.handoff[tu] != NONE {
            self.handoff[tu]
        } else {
            // The high level's own stream for a high node, else the normal one.
            self.workers[w].streams[usize::from(self.level[tu] == 0)]
        };
        self.stream_of[tu] = stream;
        let mut left = 0;
        for k in self.dpred_start[tu] as usize..self.dpred_start[tu + 1] as usize {
            let p = self.dpred[k] as usize;
            if !self.dev_done[p] {
                left += 1;
                self.dev_waiters[p].push(t);
            }
        }
        self.dev_left[tu] = left;
        self.streams[stream as usize].queue.push_back(t);
        self.try_start_stream(stream);
    }

    /// Starts stream `s`'s head kernel if it may start now.
    pub(crate) fn try_start_stream(&mut self, s: u32) {
        let st = &self.streams[s as usize];
        let Some(&head) = st.queue.front() else {
            return;
        };
        if st.running || self.dev_left[head as usize] > 0 {
            return;
        }
        let lat = self
            .machine
            .gpu
            .as_ref()
            .map_or(0.0, |g| g.launch_latency_s);
        let earliest = self.t.end[head as usize] + lat;
        if self.now < earliest {
            self.at(earliest, Ev::StreamCheck(s));
            return;
        }
        let (gpu, high) = (st.gpu, st.high);
        self.streams[s as usize].running = true;
        self.t.dev_start[head as usize] = self.now;
        let res = self.hosts.len() as u32 + gpu;
        let h = head as usize;
        let demand = Demand {
            share: self.occ[h],
            interference: self.interference[h],
            high,
        };
        self.fluid_add(res, Owner::Kernel(head), self.dev_s[h], demand);
    }

    pub(crate) fn kernel_done(&mut self, t: u32) {
        let tu = t as usize;
        self.dev_done[tu] = true;
        self.t.dev_end[tu] = self.now;
        let s = self.stream_of[tu];
        let st = &mut self.streams[s as usize];
        st.running = false;
        st.queue.pop_front();
        self.rec.kernel(s, t, self.t.dev_start[tu], self.now);
        for x in std::mem::take(&mut self.dev_waiters[tu]) {
            self.dev_left[x as usize] -= 1;
            if self.dev_left[x as usize] == 0 {
                self.try_start_stream(self.stream_of[x as usize]);
            }
        }
        self.try_start_stream(s);
        if self.defer[tu] {
            let seen = self.machine.gpu.as_ref().map_or(0.0, |g| g.completion_s);
            self.at(self.now + seen, Ev::DeferredReady(t));
        }
    }
}

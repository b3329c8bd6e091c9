//! Messages in virtual time: each rank's communication thread (one job at a time: a send's
//! command, an arrival), and the links' ports. A message crosses its path's stages (a GPU
//! value staged through the host: device-to-host copy, the host link, host-to-device copy);
//! at each stage it waits for the stage's out-port (one message at a time, in arrival order,
//! or by send priority), holds it for `bytes / bandwidth`, and is written into the in-port
//! after the messages before it there; the next stage starts once the first chunk is through.

use super::fluid::{Demand, Owner};
use super::{CommJob, Ev, Msg, Port, Stage, World, NONE};
use crate::machine::{GpuTransfer, Link, Machine};

/// Port indices of the machine's link endpoints.
pub(crate) struct PortIds {
    shm_out: Vec<u32>,
    shm_in: Vec<u32>,
    nvl_out: Vec<u32>,
    nvl_in: Vec<u32>,
    d2h: Vec<u32>,
    h2d: Vec<u32>,
    net_out: Vec<u32>,
    net_in: Vec<u32>,
}

fn port(ports: &mut Vec<Port>, name: String) -> u32 {
    ports.push(Port {
        name,
        busy: false,
        queue: Default::default(),
        in_free: 0.0,
        busy_s: 0.0,
        bytes: 0.0,
    });
    (ports.len() - 1) as u32
}

impl PortIds {
    pub(crate) fn new(m: &Machine) -> (Vec<Port>, PortIds) {
        let mut ports = Vec::new();
        let ranks = m.ranks();
        let gpus = m.hosts * m.gpus_per_host;
        let rails = m.links.network.ports.max(1);
        let mut each = |n: usize, f: &dyn Fn(usize) -> String| -> Vec<u32> {
            (0..n).map(|i| port(&mut ports, f(i))).collect()
        };
        let ids = PortIds {
            shm_out: each(ranks, &|r| format!("rank {r} shared memory, out")),
            shm_in: each(ranks, &|r| format!("rank {r} shared memory, in")),
            nvl_out: each(gpus, &|g| format!("GPU {g} NVLink, out")),
            nvl_in: each(gpus, &|g| format!("GPU {g} NVLink, in")),
            d2h: each(gpus, &|g| format!("GPU {g} PCIe, device to host")),
            h2d: each(gpus, &|g| format!("GPU {g} PCIe, host to device")),
            net_out: each(m.hosts * rails, &|i| {
                format!("host {} rail {} network, out", i / rails, i % rails)
            }),
            net_in: each(m.hosts * rails, &|i| {
                format!("host {} rail {} network, in", i / rails, i % rails)
            }),
        };
        (ports, ids)
    }
}

fn stage(out: u32, inp: u32, link: &Link) -> Stage {
    Stage {
        out,
        inp,
        bw: link.bandwidth_gb_s * 1e9,
        lat: link.latency_s,
    }
}

impl World<'_> {
    fn send_task(&self, tr: u32) -> u32 {
        (self.graph.nodes.len() + tr as usize) as u32
    }

    fn recv_task(&self, tr: u32) -> u32 {
        (self.graph.nodes.len() + self.lowering.transfers.len() + tr as usize) as u32
    }

    /// Whether transfer `tr` is a host value copied by the communication threads (no port
    /// stage: its copies are their jobs' work).
    pub(crate) fn cpu_copied(&self, tr: u32) -> bool {
        let m = self.machine;
        let x = &self.lowering.transfers[tr as usize];
        m.links.shm.cpu_copy
            && m.host_of(x.from) == m.host_of(x.to)
            && !self.graph.nodes[x.producer as usize].gpu
    }

    /// The stages of transfer `tr`'s message (none for a copied one).
    pub(crate) fn path(&self, tr: u32) -> Vec<Stage> {
        if self.cpu_copied(tr) {
            return Vec::new();
        }
        let m = self.machine;
        let ids = &self.port_ids;
        let x = &self.lowering.transfers[tr as usize];
        let (a, b) = (x.from, x.to);
        let (ha, hb) = (m.host_of(a), m.host_of(b));
        let rails = m.links.network.ports.max(1);
        let host_stage = if ha == hb {
            stage(ids.shm_out[a], ids.shm_in[b], &m.links.shm)
        } else {
            stage(
                ids.net_out[ha * rails + m.rail_of(a)],
                ids.net_in[hb * rails + m.rail_of(b)],
                &m.links.network,
            )
        };
        let gpu_value = self.graph.nodes[x.producer as usize].gpu;
        let (ga, gb) = (m.gpu_of(a), m.gpu_of(b));
        if !gpu_value {
            return vec![host_stage];
        }
        match m.links.gpu_transfer {
            GpuTransfer::Direct => match (&m.links.nvlink, ga, gb) {
                (Some(nvl), Some(ga), Some(gb)) if ha == hb => {
                    vec![stage(ids.nvl_out[ga], ids.nvl_in[gb], nvl)]
                }
                _ => vec![host_stage],
            },
            GpuTransfer::Staged => {
                let pcie = m.links.pcie.as_ref().expect("checked: staged needs pcie");
                let mut v = Vec::with_capacity(3);
                // A relay forwards from the pinned host memory it received into.
                if let (Some(ga), None) = (ga, self.via[tr as usize]) {
                    v.push(stage(ids.d2h[ga], NONE, pcie));
                }
                v.push(host_stage);
                if let Some(gb) = gb {
                    v.push(stage(ids.h2d[gb], NONE, pcie));
                }
                v
            }
        }
    }

    /// A send node's body handed its value to its rank's communication thread.
    pub(crate) fn comm_send(&mut self, tr: u32) {
        let r = self.lowering.transfers[tr as usize].from;
        self.push_job(r, CommJob::Send(tr));
    }

    fn push_job(&mut self, r: usize, job: CommJob) {
        self.ranks[r].comm.queue.push_back(job);
        if !self.ranks[r].comm.busy {
            self.start_job(r);
        }
    }

    fn start_job(&mut self, r: usize) {
        let comm = &mut self.ranks[r].comm;
        let Some(job) = comm.queue.pop_front() else {
            return;
        };
        let (base, tr) = match job {
            CommJob::Send(tr) => (self.machine.comm.send_s, tr),
            CommJob::Recv(tr) => (self.machine.comm.recv_s, tr),
        };
        comm.busy = true;
        comm.started = self.now;
        comm.current = Some(job);
        // A copied value: half its time on each side's thread.
        let copy = if self.cpu_copied(tr) {
            self.bytes[self.send_task(tr) as usize] / (self.machine.links.shm.bandwidth_gb_s * 2e9)
        } else {
            0.0
        };
        let host = self.machine.host_of(r);
        if self.host_ample[host] {
            self.at(self.now + base + copy, Ev::CommDone(r as u32));
        } else {
            // Its work shares the host's cores.
            self.fluid_add(
                host as u32,
                Owner::Comm(r as u32),
                base + copy,
                Demand::CORE,
            );
        }
    }

    pub(crate) fn comm_done(&mut self, r: u32) {
        let ru = r as usize;
        let comm = &mut self.ranks[ru].comm;
        comm.busy = false;
        comm.busy_s += self.now - comm.started;
        comm.last_active = self.now;
        let started = comm.started;
        match comm.current.take() {
            Some(CommJob::Send(tr)) => {
                self.rec.comm(r, self.send_task(tr), started, self.now);
                self.msgs[tr as usize] = Msg {
                    stages: self.path(tr),
                    at: 0,
                    prev_end: 0.0,
                    prio: if self.send_priorities {
                        i64::from(self.lowering.transfers[tr as usize].priority)
                    } else {
                        0
                    },
                    queued: self.now,
                };
                if self.msgs[tr as usize].stages.is_empty() {
                    // Copied out by this thread already: it arrives after the latency.
                    let lat = self.machine.links.shm.latency_s;
                    self.at(self.now + lat, Ev::Arrive(tr));
                } else {
                    self.stage_enter(tr);
                }
            }
            Some(CommJob::Recv(tr)) => {
                let t = self.recv_task(tr);
                self.rec.comm(r, t, started, self.now);
                self.deferred_ready(t);
            }
            None => {}
        }
        self.start_job(ru);
    }

    /// Message `m` waits for its current stage's out-port.
    pub(crate) fn stage_enter(&mut self, m: u32) {
        let msg = &mut self.msgs[m as usize];
        msg.queued = self.now;
        let p = msg.stages[msg.at].out;
        let prio = msg.prio;
        self.seq_ports += 1;
        let seq = self.seq_ports;
        let port = &mut self.ports[p as usize];
        port.queue.push((prio, std::cmp::Reverse(seq), m));
        if !port.busy {
            self.port_start(p);
        }
    }

    fn port_start(&mut self, p: u32) {
        let Some((_, _, m)) = self.ports[p as usize].queue.pop() else {
            return;
        };
        let bytes = self.bytes[self.send_task(m) as usize];
        let chunk = (self.machine.links.chunk_bytes as f64).min(bytes);
        let msg = &self.msgs[m as usize];
        let (at, last) = (msg.at, msg.at + 1 == msg.stages.len());
        let Stage { inp, bw, lat, .. } = msg.stages[at];
        let prev_end = msg.prev_end;
        let d = bytes / bw;
        let port = &mut self.ports[p as usize];
        port.busy = true;
        port.busy_s += d;
        port.bytes += bytes;
        self.at(self.now + d, Ev::PortFree(p));
        let mut in_start = self.now;
        if inp != NONE {
            let ip = &mut self.ports[inp as usize];
            in_start = in_start.max(ip.in_free);
            ip.in_free = in_start + d;
        }
        let mut end = in_start + d + lat;
        if at > 0 {
            end = end.max(prev_end + chunk / bw + lat);
        }
        self.rec.port(p, self.send_task(m), self.now, self.now + d);
        let msg = &mut self.msgs[m as usize];
        if last {
            self.at(end, Ev::Arrive(m));
        } else {
            msg.prev_end = end;
            msg.at += 1;
            self.at(in_start + chunk / bw + lat, Ev::StageEnter(m));
        }
    }

    pub(crate) fn port_free(&mut self, p: u32) {
        self.ports[p as usize].busy = false;
        self.port_start(p);
    }

    /// Message `m` is at its rank: the send is complete; the receiving communication thread
    /// sees it at once if it was busy lately, else after its timed park.
    pub(crate) fn arrive(&mut self, m: u32) {
        self.deferred_ready(self.send_task(m));
        let to = self.lowering.transfers[m as usize].to;
        let comm = &self.ranks[to].comm;
        let idle = !comm.busy && self.now - comm.last_active > self.machine.comm.active_s;
        let delay = if idle {
            self.machine.comm.idle_poll_s
        } else {
            0.0
        };
        self.at(self.now + delay, Ev::CommRecv(m));
    }

    pub(crate) fn comm_recv(&mut self, m: u32) {
        let to = self.lowering.transfers[m as usize].to;
        self.push_job(to, CommJob::Recv(m));
    }
}

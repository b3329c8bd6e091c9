//! The world of one simulation: the graph lowered with the ranks crate's `plan::lower`, every
//! rank's plan as tasks (compute nodes, sends, receives) with their local edges, costs sampled
//! once per task in task order (so the same seed gives the same costs whatever the run's
//! order), workers, streams, GPUs, ports.

use std::collections::{BinaryHeap, VecDeque};

use boundpool_ranks::plan::{k_ary, lower, per_host, relay, LocalNode};
use boundpool_scheduler::Priority;
use rand_core::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::net::PortIds;
use super::record::{Recorder, Times};
use super::{
    Broadcast, Comm, Fluid, RankState, SimOptions, Stream, WState, What, Worker, World, ANY, NONE,
};
use crate::error::{SimError, SimErrorKind, SimResult};
use crate::graph::SimGraph;
use crate::machine::Machine;
use crate::CostModel;

/// The queue index of a level: high 0, normal 1, low 2.
pub(crate) fn lvl(p: Priority) -> u8 {
    match p {
        Priority::High => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}

pub(crate) fn level_of(i: u8) -> Priority {
    [Priority::High, Priority::Normal, Priority::Low][i as usize]
}

fn invalid(m: String) -> SimError {
    SimError::new(SimErrorKind::InvalidMachine, m)
}

/// Checks that every node can run where the graph places it on `machine`.
fn check_placement(graph: &SimGraph, machine: &Machine) -> SimResult<()> {
    for (i, n) in graph.nodes.iter().enumerate() {
        let name = &graph.desc.nodes[i].name;
        let Some(g) = machine.groups.get(n.group) else {
            return Err(invalid(format!(
                "node '{name}' (#{i}) is placed on group {}, but machine '{}' has {} group(s) a rank",
                n.group,
                machine.name,
                machine.groups.len()
            )));
        };
        if n.gpu && !g.gpu {
            return Err(invalid(format!(
                "node '{name}' (#{i}) is a GPU node on group '{}', which has no GPU on machine '{}'",
                g.name, machine.name
            )));
        }
    }
    Ok(())
}

pub(crate) fn world<'a>(
    graph: &'a SimGraph,
    machine: &'a Machine,
    costs: &CostModel,
    opts: &SimOptions,
) -> SimResult<World<'a>> {
    machine.check()?;
    costs.check()?;
    check_placement(graph, machine)?;
    let flat = lower(&graph.desc, machine.ranks()).map_err(|e| {
        SimError::new(
            SimErrorKind::InvalidGraph,
            format!(
                "graph '{}' on {} ranks: {e}",
                graph.desc.name,
                machine.ranks()
            ),
        )
        .with_source(e)
    })?;
    // The runtime's relays (`plan::relay`): one copy a host is what `RanksBuilder` does.
    let lowering = match opts.broadcast {
        Broadcast::Flat => flat,
        Broadcast::Tree { fanout } => relay(&graph.desc, &flat, &*k_ary(fanout)),
        Broadcast::PerHost => {
            let hosts = (0..machine.ranks()).map(|r| machine.host_of(r)).collect();
            relay(&graph.desc, &flat, &*per_host(hosts))
        }
    };
    let via: Vec<Option<u32>> = lowering.transfers.iter().map(|t| t.via).collect();
    let n = graph.nodes.len();
    let nt = lowering.transfers.len();
    let tasks = n + 2 * nt;
    let send = |t: u32| (n + t as usize) as u32;
    let recv = |t: u32| (n + nt + t as usize) as u32;
    let id = |x: LocalNode| match x {
        LocalNode::Compute(i) => i,
        LocalNode::Send(t) => send(t),
        LocalNode::Recv(t) => recv(t),
    };

    let mut what = Vec::with_capacity(tasks);
    let mut rank_of = Vec::with_capacity(tasks);
    what.extend((0..n as u32).map(What::Compute));
    rank_of.extend(lowering.rank_of.iter().map(|&r| r as u32));
    what.extend((0..nt as u32).map(What::Send));
    rank_of.extend(lowering.transfers.iter().map(|t| t.from as u32));
    what.extend((0..nt as u32).map(What::Recv));
    rank_of.extend(lowering.transfers.iter().map(|t| t.to as u32));

    // Local edges, as a successor list per task.
    let mut edges: Vec<(u32, u32)> = lowering
        .plans
        .iter()
        .flat_map(|p| p.edges.iter().map(|&(a, b)| (id(a), id(b))))
        .collect();
    edges.sort_unstable();
    edges.dedup();
    let mut succ_start = vec![0u32; tasks + 1];
    let mut indeg = vec![0u32; tasks];
    for &(a, b) in &edges {
        succ_start[a as usize + 1] += 1;
        indeg[b as usize] += 1;
    }
    for i in 0..tasks {
        succ_start[i + 1] += succ_start[i];
    }
    let succ: Vec<u32> = edges.iter().map(|&(_, b)| b).collect();

    let mut place = vec![ANY; tasks];
    let mut level = vec![1u8; tasks];
    let mut is_gpu = vec![false; tasks];
    let mut bytes = vec![0.0f64; tasks];
    for (i, spec) in graph.nodes.iter().enumerate() {
        place[i] = spec.group as u16;
        level[i] = lvl(spec.priority);
        is_gpu[i] = spec.gpu;
        bytes[i] = spec.out_bytes as f64;
    }
    for (t, tr) in lowering.transfers.iter().enumerate() {
        let b = graph.nodes[tr.producer as usize].out_bytes as f64;
        bytes[send(t as u32) as usize] = b;
        bytes[recv(t as u32) as usize] = b;
    }

    // A GPU node's device predecessors: GPU nodes of its rank it reads.
    let mut dpreds: Vec<(u32, u32)> = edges
        .iter()
        .filter(|&&(a, b)| {
            (b as usize) < n && (a as usize) < n && is_gpu[a as usize] && is_gpu[b as usize]
        })
        .map(|&(a, b)| (b, a))
        .collect();
    dpreds.sort_unstable();
    let mut dpred_start = vec![0u32; tasks + 1];
    for &(b, _) in &dpreds {
        dpred_start[b as usize + 1] += 1;
    }
    for i in 0..tasks {
        dpred_start[i + 1] += dpred_start[i];
    }
    let dpred: Vec<u32> = dpreds.iter().map(|&(_, a)| a).collect();

    // Deferred: sends and receives; a GPU node with a successor that is not a GPU node of
    // its rank (or with none: a sink) completes when its device work is seen done.
    let mut defer = vec![true; tasks];
    for i in 0..n {
        let s = &succ[succ_start[i] as usize..succ_start[i + 1] as usize];
        defer[i] = is_gpu[i]
            && (s.is_empty() || s.iter().any(|&x| x as usize >= n || !is_gpu[x as usize]));
    }

    let Sampled {
        host_s,
        dev_s,
        occ,
        interference,
    } = sample_costs(graph, machine, costs, opts.seed, n, 2 * nt)?;

    let (workers, ranks, streams) = make_workers(machine, opts.seed, &rank_of, &level);
    let nworkers = workers.len();
    // Workers, and the communication threads where there are several ranks.
    let threads = machine.workers_per_rank() + usize::from(machine.ranks() > 1);
    let host_workers = machine.ranks_per_host * threads;
    let hosts: Vec<Fluid> = (0..machine.hosts)
        .map(|_| Fluid::new(machine.cores_per_host as f64, false))
        .collect();
    let gpus: Vec<Fluid> = (0..machine.hosts * machine.gpus_per_host)
        .map(|_| {
            Fluid::new(
                1.0,
                machine.gpu.as_ref().is_some_and(|g| g.stream_priorities),
            )
        })
        .collect();
    let (ports, port_ids) = PortIds::new(machine);
    let w = World {
        machine,
        graph,
        via,
        what,
        rank_of,
        place,
        level,
        is_gpu,
        defer,
        host_s,
        dev_s,
        occ,
        interference,
        succ_start,
        succ,
        indeg,
        dpred_start,
        dpred,
        bytes,
        send_priorities: opts.send_priorities,
        ready_flag: vec![false; tasks],
        registered: vec![NONE; tasks],
        dev_done: vec![false; tasks],
        dev_left: vec![0; tasks],
        dev_waiters: vec![Vec::new(); tasks],
        handoff: vec![NONE; tasks],
        stream_of: vec![NONE; tasks],
        done: vec![false; tasks],
        t: Times::new(tasks),
        host_ample: vec![host_workers <= machine.cores_per_host; machine.hosts],
        workers,
        ranks,
        streams,
        hosts,
        gpus,
        ports,
        port_ids,
        msgs: (0..nt).map(|_| super::Msg::default()).collect(),
        heap: BinaryHeap::new(),
        seq: 0,
        now: 0.0,
        events: 0,
        rec: Recorder::new(opts.trace),
        tasks_done: 0,
        seq_ports: 0,
        spin_on: vec![false; nworkers],
        spin_ver: vec![0; nworkers],
        lowering,
    };
    Ok(w)
}

/// Per task: host seconds, device seconds, occupancy and interference.
struct Sampled {
    host_s: Vec<f64>,
    dev_s: Vec<f64>,
    occ: Vec<f64>,
    interference: Vec<f64>,
}

/// Every task's costs, sampled in task order.
fn sample_costs(
    graph: &SimGraph,
    machine: &Machine,
    costs: &CostModel,
    seed: u64,
    n: usize,
    comm_tasks: usize,
) -> SimResult<Sampled> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut host_s = Vec::with_capacity(n + comm_tasks);
    let mut dev_s = vec![0.0; n + comm_tasks];
    let mut occ = vec![1.0; n + comm_tasks];
    let mut interference = vec![1.0; n + comm_tasks];
    for (i, spec) in graph.nodes.iter().enumerate() {
        let c = costs.get(&spec.kind).map_err(|e| {
            SimError::new(
                SimErrorKind::MissingCost,
                format!("node '{}' (#{i}): {e}", graph.desc.nodes[i].name),
            )
        })?;
        host_s.push(c.host.sample(&mut rng) * spec.scale);
        if spec.gpu {
            let Some(g) = &c.gpu else {
                return Err(SimError::new(
                    SimErrorKind::MissingCost,
                    format!(
                        "node '{}' (#{i}) is a GPU node, but kind '{}' has no device time",
                        graph.desc.nodes[i].name, spec.kind
                    ),
                ));
            };
            dev_s[i] = g.sample(&mut rng) * spec.scale;
            occ[i] = c.occupancy;
            interference[i] = c.interference;
        }
    }
    host_s.extend(std::iter::repeat_n(machine.comm.node_s, comm_tasks));
    Ok(Sampled {
        host_s,
        dev_s,
        occ,
        interference,
    })
}

type Made = (Vec<Worker>, Vec<RankState>, Vec<Stream>);

fn make_workers(machine: &Machine, seed: u64, rank_of: &[u32], level: &[u8]) -> Made {
    let mut workers = Vec::new();
    let mut ranks = Vec::new();
    let mut streams = Vec::new();
    let mut left = vec![0usize; machine.ranks()];
    let mut prioritized = vec![false; machine.ranks()];
    for (t, &r) in rank_of.iter().enumerate() {
        left[r as usize] += 1;
        prioritized[r as usize] |= level[t] != 1;
    }
    for r in 0..machine.ranks() {
        let mut groups = Vec::new();
        for (g, desc) in machine.groups.iter().enumerate() {
            let first = workers.len() as u32;
            for _ in 0..desc.workers {
                let w = workers.len() as u32;
                let gpu = if desc.gpu {
                    machine.gpu_of(r).map(|x| x as u32)
                } else {
                    None
                };
                let mut st = [NONE; 2];
                if let Some(gpu) = gpu {
                    for (k, high) in [desc.high_streams, true].into_iter().enumerate() {
                        st[k] = streams.len() as u32;
                        streams.push(Stream {
                            gpu,
                            high,
                            worker: w,
                            queue: VecDeque::new(),
                            running: false,
                        });
                    }
                }
                workers.push(Worker {
                    rank: r as u32,
                    group: g as u16,
                    host: machine.host_of(r) as u32,
                    deques: Default::default(),
                    state: WState::Idle,
                    idle_since: f64::NEG_INFINITY,
                    takes: 0,
                    // xorshift64* needs a non-zero state; one per worker, from the seed.
                    rng: (seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(w as u64 + 1) | 1,
                    deferred: Vec::new(),
                    running: NONE,
                    run_start: 0.0,
                    overhead: 0.0,
                    stolen: false,
                    polling: Vec::new(),
                    streams: st,
                    busy_s: 0.0,
                });
            }
            groups.push((first, workers.len() as u32));
        }
        let ng = groups.len();
        ranks.push(RankState {
            inj: [
                vec![VecDeque::new(); ng],
                vec![VecDeque::new(); ng],
                vec![VecDeque::new(); ng],
            ],
            any: Default::default(),
            idle: groups
                .iter()
                .map(|&(a, b)| (a..b).rev().collect())
                .collect(),
            groups,
            prioritized: prioritized[r],
            left: left[r],
            end: 0.0,
            comm: Comm::default(),
        });
    }
    (workers, ranks, streams)
}

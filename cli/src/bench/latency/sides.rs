//! What the latency bench drives ([`Side`]): a host pool or a GPU pool of device 0, each with
//! its foreground chain (at high and at normal priority) and its low-priority background.

use std::sync::Arc;

use boundpool::gpu::{
    builtin, Devices, GpuDevice, GpuError, GpuGraphBuilder, GpuGraphExt, GpuPool, GpuPoolBuilder,
    GpuWorker, Kernel, LaunchConfig, Module, SmPartition,
};
use boundpool::{BoxError, Graph, GraphBuilder, GraphHandle, Pool, PoolBuilder, Priority};
use boundpool_workloads::busy_work;

use super::{BG_BLOCK, BG_ONE_WAVE, BG_SHORT_BLOCKS, BG_WAVE, BUSY, CHAIN};

/// What the bench drives: a host pool or a GPU pool, and how it builds its two graphs.
pub(super) trait Side: Sync {
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String>;
    /// Submits a background graph; `worst` asks for the worst-case GPU shape (one wave of long
    /// blocks), which the host side does not have.
    fn submit_bg(&self, worst: bool) -> Result<GraphHandle, String>;
    /// Nodes in one background graph.
    fn bg_nodes(&self) -> u64;
}

pub(super) struct HostSide {
    pool: Pool,
    fg_high: Graph,
    fg_normal: Graph,
    bg: Graph,
    width: usize,
}

impl HostSide {
    /// A pool of `workers` with its foreground chains and a background of `width` busy nodes.
    pub(super) fn new(workers: usize, width: usize) -> Result<Self, BoxError> {
        Ok(HostSide {
            pool: PoolBuilder::new()
                .name("latency")
                .workers(workers)
                .build()?,
            fg_high: host_chain(Priority::High),
            fg_normal: host_chain(Priority::Normal),
            bg: host_wide(width),
            width,
        })
    }
}

fn host_chain(p: Priority) -> Graph {
    let mut g = GraphBuilder::new("foreground");
    let mut prev = None;
    for _ in 0..CHAIN {
        let n = g.node("link", |_| Ok(()));
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    g.priority(p);
    g.build().expect("a chain is acyclic")
}

fn host_wide(width: usize) -> Graph {
    let mut g = GraphBuilder::new("background");
    let src = g.node("src", |_| Ok(()));
    let sink = g.node("sink", |_| Ok(()));
    for _ in 0..width {
        let n = g.node("busy", |_| {
            busy_work(BUSY.as_nanos() as u64);
            Ok(())
        });
        g.edge(src, n).edge(n, sink);
    }
    g.priority(Priority::Low);
    g.build().expect("a fan-out is acyclic")
}

impl Side for HostSide {
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String> {
        let g = if high { &self.fg_high } else { &self.fg_normal };
        self.pool.submit(g).map_err(|e| e.to_string())
    }
    fn submit_bg(&self, _worst: bool) -> Result<GraphHandle, String> {
        self.pool.submit(&self.bg).map_err(|e| e.to_string())
    }
    fn bg_nodes(&self) -> u64 {
        self.width as u64 + 2
    }
}

pub(super) struct GpuSide {
    pool: GpuPool,
    fg_high: Graph<GpuWorker>,
    fg_normal: Graph<GpuWorker>,
    bg: Graph<GpuWorker>,
    bg_one_wave: Graph<GpuWorker>,
    width: usize,
}

/// Device 0 as the foreground sees it: with SM partitions, the first one (the latency-critical
/// path's reservation); else the whole device.
fn fg_device(pool: &GpuPool) -> GpuDevice {
    let d = &pool.devices()[0];
    d.partitions()
        .first()
        .and_then(|p| d.on_partition(&p.name))
        .unwrap_or_else(|| d.clone())
}

/// Device 0 as the background sees it: with two SM partitions or more, the last one; else the
/// whole device.
fn bg_device(pool: &GpuPool) -> GpuDevice {
    let d = &pool.devices()[0];
    match d.partitions() {
        [_, .., last] => d.on_partition(&last.name).unwrap_or_else(|| d.clone()),
        _ => d.clone(),
    }
}

fn gpu_chain(pool: &GpuPool, empty: &Arc<Kernel>, p: Priority) -> Result<Graph<GpuWorker>, String> {
    let device = fg_device(pool);
    let mut g = GpuGraphBuilder::new("foreground");
    let mut prev = None;
    for i in 0..CHAIN {
        let k = empty.clone();
        let n = g.gpu_node(&device, &format!("link{i}"), move |ctx| {
            // SAFETY: bp_spin takes one i64 (a cycle count); 0 returns at once.
            unsafe { ctx.launch(&k, LaunchConfig::single()).arg(0i64).launch()? };
            Ok(())
        });
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    g.priority(p);
    g.build().map_err(|e| e.to_string())
}

fn gpu_wide(
    pool: &GpuPool,
    spin_k: &Arc<Kernel>,
    width: usize,
    (waves, cycles): (u32, i64),
) -> Result<Graph<GpuWorker>, String> {
    let device = bg_device(pool);
    let mut g = GpuGraphBuilder::new("background");
    let src = g.gpu_node(&device, "src", |_| Ok(()));
    let sink = g.gpu_node(&device, "sink", |_| Ok(()));
    let cfg = LaunchConfig {
        grid: (BG_WAVE * waves, 1, 1),
        block: (BG_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    for i in 0..width {
        let k = spin_k.clone();
        let n = g.gpu_node(&device, &format!("busy{i}"), move |ctx| {
            // SAFETY: bp_spin takes one i64, the cycles every thread busy-waits; it touches no
            // memory.
            unsafe { ctx.launch(&k, cfg).arg(cycles).launch()? };
            Ok(())
        });
        g.edge(src, n).edge(n, sink);
    }
    g.priority(Priority::Low);
    g.build().map_err(|e| e.to_string())
}

impl Side for GpuSide {
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String> {
        let g = if high { &self.fg_high } else { &self.fg_normal };
        self.pool.submit(g).map_err(|e| e.to_string())
    }
    fn submit_bg(&self, worst: bool) -> Result<GraphHandle, String> {
        let g = if worst { &self.bg_one_wave } else { &self.bg };
        self.pool.submit(g).map_err(|e| e.to_string())
    }
    fn bg_nodes(&self) -> u64 {
        self.width as u64 + 2
    }
}

/// The bench's GPU pool on device 0: `workers` workers, or the `partitions`' when there are
/// any (every node is still placed on the device: any partition's worker runs it).
pub(super) fn gpu_pool(workers: usize, partitions: Vec<SmPartition>) -> Result<GpuPool, GpuError> {
    let b = GpuPoolBuilder::new()
        .name("latency-gpu")
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers);
    if partitions.is_empty() {
        b.build()
    } else {
        b.sm_partitions(partitions).build()
    }
}

impl GpuSide {
    /// `pool` with its foreground chains and backgrounds of `width` nodes (both kernel shapes).
    pub(super) fn new(pool: GpuPool, width: usize) -> Result<Self, String> {
        let m = Module::builtin();
        let spin_k = Arc::new(m.kernel(builtin::SPIN).map_err(|e| e.to_string())?);
        Ok(GpuSide {
            fg_high: gpu_chain(&pool, &spin_k, Priority::High)?,
            fg_normal: gpu_chain(&pool, &spin_k, Priority::Normal)?,
            bg: gpu_wide(&pool, &spin_k, width, BG_SHORT_BLOCKS)?,
            bg_one_wave: gpu_wide(&pool, &spin_k, width, BG_ONE_WAVE)?,
            pool,
            width,
        })
    }
}

//! `boundpool sim cholesky` and `boundpool sim graph`: one simulated run, its summary (or
//! JSON), its trace.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use boundpool_sim::workload::{
    cholesky as cholesky_graph, cholesky_costs, h100_rates, CholeskySpec,
};
use boundpool_sim::{
    kind_of, simulate_with_progress, Broadcast, Completion, CostModel, GpuTransfer, KindCost,
    Machine, Network, NodeSpec, SimGraph, SimOptions, SimReport,
};
use clap::{Args, ValueEnum};

use super::usage;
use crate::progress::Progress;

/// How values go to several ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BroadcastArg {
    Flat,
    Tree(usize),
    Hosts,
}

fn broadcast(s: &str) -> Result<BroadcastArg, String> {
    match s {
        "flat" => Ok(BroadcastArg::Flat),
        "hosts" => Ok(BroadcastArg::Hosts),
        _ => s
            .strip_prefix("tree:")
            .and_then(|k| k.parse().ok())
            .filter(|&k| k > 0)
            .map(BroadcastArg::Tree)
            .ok_or_else(|| format!("`{s}` is none of flat, tree:K, hosts")),
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompletionArg {
    /// Deferred completions seen when their worker runs dry (`complete_when`, today's).
    WhenDry,
    /// Seen at once by any worker of the group (the proposed `complete_later`).
    AtOnce,
}

/// The options every simulation takes.
#[derive(Args, Debug, Clone)]
pub(crate) struct SimFlags {
    /// Seeds the cost samples and the victim choices.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// How a value read on several ranks goes there: flat (the producer's rank sends to each),
    /// tree:K (a K-ary tree of the consuming ranks forwards it), hosts (one copy a host).
    #[arg(long, default_value = "flat", value_parser = broadcast)]
    pub(crate) broadcast: BroadcastArg,
    /// Each link port sends the most urgent value first (the lowering's transfer priority:
    /// its consumers' longest path to the end) instead of in arrival order.
    #[arg(long)]
    pub(crate) send_priorities: bool,
    /// When a deferred completion (a GPU node's device work, an arrival) releases successors.
    #[arg(long, value_enum)]
    pub(crate) completion: Option<CompletionArg>,
    /// Write the virtual run's Chrome trace here (`boundpool trace` and Perfetto open it).
    #[arg(long, value_name = "OUT.json")]
    pub(crate) trace: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
}

impl SimFlags {
    pub(crate) fn options(&self) -> SimOptions {
        SimOptions {
            seed: self.seed,
            trace: self.trace.is_some(),
            broadcast: match self.broadcast {
                BroadcastArg::Flat => Broadcast::Flat,
                BroadcastArg::Tree(k) => Broadcast::Tree { fanout: k },
                BroadcastArg::Hosts => Broadcast::PerHost,
            },
            send_priorities: self.send_priorities,
        }
    }

    pub(crate) fn apply(&self, m: &mut Machine) {
        if let Some(c) = self.completion {
            m.sched.completion = match c {
                CompletionArg::WhenDry => Completion::WhenDry,
                CompletionArg::AtOnce => Completion::AtOnce,
            };
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NetworkArg {
    /// 4 x 200 Gb/s InfiniBand a host.
    Ib,
    /// One 25 GB/s Ethernet port a host.
    Eth,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TransferArg {
    /// Through pinned host memory (boundpool-ranks without NCCL).
    Staged,
    /// GPU to GPU (NVLink, GPUDirect RDMA: NCCL's path).
    Direct,
}

impl NetworkArg {
    pub(crate) fn network(self) -> Network {
        match self {
            NetworkArg::Ib => Network::InfiniBand4x200,
            NetworkArg::Eth => Network::Ethernet25,
        }
    }
}

impl TransferArg {
    pub(crate) fn transfer(self) -> GpuTransfer {
        match self {
            TransferArg::Staged => GpuTransfer::Staged,
            TransferArg::Direct => GpuTransfer::Direct,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct CholeskyArgs {
    /// Order of the matrix.
    #[arg(long, default_value_t = 65536)]
    n: usize,
    /// Tile size.
    #[arg(long, default_value_t = 2048)]
    tile: usize,
    /// GPUs (one rank each, 8 a host).
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// The network between hosts.
    #[arg(long, value_enum, default_value_t = NetworkArg::Ib)]
    network: NetworkArg,
    /// How GPU values cross ranks.
    #[arg(long, value_enum, default_value_t = TransferArg::Direct)]
    transfer: TransferArg,
    /// A machine description (JSON) instead of the H100 preset.
    #[arg(long, value_name = "FILE.json")]
    machine: Option<PathBuf>,
    /// A cost model (JSON, `boundpool sim costs`) instead of the H100 kernel rates of
    /// docs/benchmarks.md (tiles 1024, 2048, 4096).
    #[arg(long, value_name = "FILE.json")]
    costs: Option<PathBuf>,
    /// The critical path at normal priority.
    #[arg(long)]
    no_critical: bool,
    #[command(flatten)]
    flags: SimFlags,
}

/// Runs one simulation with a progress bar.
pub(crate) fn run_one(
    g: &SimGraph,
    m: &Machine,
    c: &CostModel,
    flags: &SimFlags,
) -> Result<SimReport, String> {
    let mut bar = Progress::new(1000, "sim", flags.quiet);
    let r = simulate_with_progress(g, m, c, &flags.options(), &mut |done, total| {
        bar.set(done as u64 * 1000 / total.max(1) as u64)
    });
    bar.finish();
    r.map_err(|e| e.to_string())
}

/// Prints `r` (summary or JSON) and writes its trace.
pub(crate) fn output(r: &SimReport, flags: &SimFlags) -> ExitCode {
    if flags.json {
        println!("{}", r.to_json());
    } else {
        print!("{}", r.summary());
    }
    if let (Some(path), Some(trace)) = (&flags.trace, &r.trace) {
        let json = boundpool::observe::chrome_trace(trace, |_, _| {});
        if let Err(e) = std::fs::write(path, json.to_string()) {
            eprintln!("boundpool sim: cannot write {}: {e}", path.display());
            return ExitCode::from(1);
        }
        if !flags.json {
            println!(
                "trace: {} slices on {} tracks written to {}",
                trace.slices.len(),
                trace.tracks.len(),
                path.display()
            );
        }
    }
    ExitCode::SUCCESS
}

pub(crate) fn load_machine(path: &Path) -> Result<Machine, String> {
    Machine::load(path).map_err(|e| e.to_string())
}

pub(crate) fn load_costs(path: &Path) -> Result<CostModel, String> {
    CostModel::load(path).map_err(|e| e.to_string())
}

pub(crate) fn cholesky(a: CholeskyArgs) -> ExitCode {
    let mut m = match &a.machine {
        Some(p) => match load_machine(p) {
            Ok(m) => m,
            Err(e) => return usage(e),
        },
        None => Machine::h100_cluster(a.gpus, a.network.network(), a.transfer.transfer()),
    };
    a.flags.apply(&mut m);
    let costs = match &a.costs {
        Some(p) => load_costs(p),
        None => h100_rates(a.tile)
            .map(|r| cholesky_costs(a.tile, &r))
            .ok_or_else(|| {
                format!(
                    "no measured H100 kernel rates for tile {} (there are for 1024, 2048, 4096): \
                     give --costs",
                    a.tile
                )
            }),
    };
    let costs = match costs {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let mut spec = CholeskySpec::new(a.n, a.tile, m.ranks());
    spec.critical_high = !a.no_critical;
    if m.groups.len() < 2 {
        (spec.panel_group, spec.update_group) = (0, 0);
    }
    spec.gpu = m.groups.iter().any(|g| g.gpu);
    let g = match cholesky_graph(&spec) {
        Ok(g) => g,
        Err(e) => return usage(e),
    };
    match run_one(&g, &m, &costs, &a.flags) {
        Ok(r) => output(&r, &a.flags),
        Err(e) => usage(e),
    }
}

#[derive(Args, Debug)]
pub(crate) struct GraphArgs {
    /// The graph file.
    file: PathBuf,
    /// Ranks (a node's `"rank"` must be below; nodes without run on rank 0).
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// Workers a rank.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Bytes of every node's output.
    #[arg(long, default_value_t = 8)]
    bytes: u64,
    /// A machine description (JSON) instead of this 2-core machine's.
    #[arg(long, value_name = "FILE.json")]
    machine: Option<PathBuf>,
    /// A cost model by node kind; nodes whose kind it lacks cost their `work_ns`.
    #[arg(long, value_name = "FILE.json")]
    costs: Option<PathBuf>,
    #[command(flatten)]
    flags: SimFlags,
}

pub(crate) fn graph(a: GraphArgs) -> ExitCode {
    let text = match std::fs::read_to_string(&a.file) {
        Ok(t) => t,
        Err(e) => return usage(format!("cannot read {}: {e}", a.file.display())),
    };
    let stem = a
        .file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let f = match boundpool::graph_file::parse(&text, &stem) {
        Ok(f) => f,
        Err(e) => return usage(format!("{}: {e}", a.file.display())),
    };
    let mut m = match &a.machine {
        Some(p) => match load_machine(p) {
            Ok(m) => m,
            Err(e) => return usage(e),
        },
        None => Machine::dev_host(a.ranks, a.workers),
    };
    a.flags.apply(&mut m);
    let mut costs = match &a.costs {
        Some(p) => match load_costs(p) {
            Ok(c) => c,
            Err(e) => return usage(e),
        },
        None => CostModel::default(),
    };
    let mut g = SimGraph::new(f.name.clone());
    for (i, name) in f.names.iter().enumerate() {
        // A node's kind is its label; one the model lacks costs its own work_ns.
        let kind = if costs.kinds.contains_key(kind_of(name)) {
            kind_of(name).to_owned()
        } else {
            let k = format!("{name} (work_ns)");
            costs.set(k.clone(), KindCost::host(f.work_ns[i] as f64 * 1e-9));
            k
        };
        g.node(
            name.clone(),
            f.ranks[i].unwrap_or(0) as usize,
            NodeSpec::host(kind).bytes(a.bytes),
        );
    }
    for &(x, y) in &f.edges {
        g.edge(x, y);
    }
    match run_one(&g, &m, &costs, &a.flags) {
        Ok(r) => output(&r, &a.flags),
        Err(e) => usage(e),
    }
}

//! `boundpool sim scaling`: the distributed tiled Cholesky over N and GPU counts on both
//! networks, as a markdown table (docs/benchmarks.md's scaling table).

use std::process::ExitCode;

use boundpool_sim::workload::{cholesky, cholesky_costs, h100_rates, CholeskySpec};
use boundpool_sim::Machine;
use clap::Args;

use super::run::{run_one, NetworkArg, SimFlags, TransferArg};
use super::usage;

#[derive(Args, Debug)]
pub(crate) struct ScalingArgs {
    /// Orders of the matrix.
    #[arg(long, value_delimiter = ',', default_values_t = [65536, 131072, 262144])]
    n: Vec<usize>,
    /// GPU counts (8 a host).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8, 16, 32, 64])]
    gpus: Vec<usize>,
    /// Tile size (the H100 rates of docs/benchmarks.md exist for 1024, 2048, 4096).
    #[arg(long, default_value_t = 2048)]
    tile: usize,
    /// Networks.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [NetworkArg::Ib, NetworkArg::Eth])]
    network: Vec<NetworkArg>,
    /// How GPU values cross ranks.
    #[arg(long, value_enum, default_value_t = TransferArg::Direct)]
    transfer: TransferArg,
    #[command(flatten)]
    flags: SimFlags,
}

pub(crate) fn main(a: ScalingArgs) -> ExitCode {
    let Some(rates) = h100_rates(a.tile) else {
        return usage(format!("no H100 kernel rates for tile {}", a.tile));
    };
    let costs = cholesky_costs(a.tile, &rates);
    println!(
        "| N | GPUs | network | time (s) | TFLOP/s | of peak | speed-up | matrix a GPU (GiB) | limit |"
    );
    println!("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |");
    for &n in &a.n {
        // Speed-up against the first run of this N (one GPU by default), on either network.
        let mut base = None;
        for &net in &a.network {
            for &gpus in &a.gpus {
                if net == NetworkArg::Eth && gpus <= 8 && a.network.len() > 1 {
                    continue; // one host: no network between hosts
                }
                let mut m = Machine::h100_cluster(gpus, net.network(), a.transfer.transfer());
                a.flags.apply(&mut m);
                let g = match cholesky(&CholeskySpec::new(n, a.tile, gpus)) {
                    Ok(g) => g,
                    Err(e) => return usage(e),
                };
                let r = match run_one(&g, &m, &costs, &a.flags) {
                    Ok(r) => r,
                    Err(e) => return usage(e),
                };
                let t = r.makespan_s;
                let base_t = *base.get_or_insert(t * gpus as f64);
                // The lower triangle's tiles, dealt evenly.
                let gib = (n as f64).powi(2) / 2.0 * 8.0 / gpus as f64 / (1u64 << 30) as f64;
                let prec = usize::from(gib < 10.0);
                println!(
                    "| {n} | {gpus} | {} | {:.2} | {:.0} | {:.0}% | {:.1}x | {:.prec$}{} | {} |",
                    if gpus <= 8 {
                        "NVLink"
                    } else {
                        match net {
                            NetworkArg::Ib => "IB 4x200",
                            NetworkArg::Eth => "Eth 25 GB/s",
                        }
                    },
                    t,
                    r.tflops(),
                    r.efficiency() * 100.0,
                    base_t / t,
                    gib,
                    if gib > 76.0 { " (does not fit)" } else { "" },
                    r.limit()
                );
            }
        }
    }
    ExitCode::SUCCESS
}

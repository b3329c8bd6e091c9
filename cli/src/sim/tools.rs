//! `boundpool sim costs` (a cost model from a Chrome trace) and `boundpool sim machine` (a
//! preset's JSON).

use std::path::PathBuf;
use std::process::ExitCode;

use boundpool_sim::{kind_of, CostModel, Machine};
use clap::{Args, ValueEnum};

use super::run::{NetworkArg, TransferArg};
use super::usage;

#[derive(Args, Debug)]
pub(crate) struct CostsArgs {
    /// A Chrome trace (`boundpool run --trace`, the examples' `--trace`).
    trace: PathBuf,
    /// Write the cost model here (default: print it).
    #[arg(long, short, value_name = "OUT.json")]
    out: Option<PathBuf>,
    /// Each node its own kind (default: kinds by name, `gemm(3,1,0)` is `gemm`).
    #[arg(long)]
    per_node: bool,
    /// Where the trace comes from (card, command, date), kept in the model.
    #[arg(long, default_value = "")]
    source: String,
}

pub(crate) fn costs(a: CostsArgs) -> ExitCode {
    let text = match std::fs::read_to_string(&a.trace) {
        Ok(t) => t,
        Err(e) => return usage(format!("cannot read {}: {e}", a.trace.display())),
    };
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return usage(format!("{} is not JSON: {e}", a.trace.display())),
    };
    let label: &dyn Fn(&str) -> String = if a.per_node {
        &|n: &str| n.to_owned()
    } else {
        &|n: &str| kind_of(n).to_owned()
    };
    let source = if a.source.is_empty() {
        a.trace.display().to_string()
    } else {
        a.source.clone()
    };
    let m = match CostModel::from_chrome_trace(&v, label, &source) {
        Ok(m) => m,
        Err(e) => return usage(e),
    };
    match &a.out {
        Some(p) => {
            if let Err(e) = m.save(p) {
                return usage(e);
            }
            println!("{} kinds written to {}", m.kinds.len(), p.display());
            for (k, c) in &m.kinds {
                println!(
                    "  {k}: {} samples, host median {:.1} us{}",
                    c.samples,
                    c.host.median() * 1e6,
                    c.gpu
                        .as_ref()
                        .map(|g| format!(", device median {:.1} us", g.median() * 1e6))
                        .unwrap_or_default()
                );
            }
        }
        None => println!(
            "{}",
            serde_json::to_string_pretty(&m).expect("a cost model serializes")
        ),
    }
    ExitCode::SUCCESS
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Preset {
    /// This 2-core machine (--ranks, --workers).
    Dev,
    /// H100 SXM GPUs, 8 a host (--gpus, --network, --transfer).
    H100,
}

#[derive(Args, Debug)]
pub(crate) struct MachineArgs {
    /// The preset.
    #[arg(value_enum)]
    preset: Preset,
    /// Ranks (dev).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Workers a rank (dev).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// GPUs (h100).
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// The network between hosts (h100).
    #[arg(long, value_enum, default_value_t = NetworkArg::Ib)]
    network: NetworkArg,
    /// How GPU values cross ranks (h100).
    #[arg(long, value_enum, default_value_t = TransferArg::Direct)]
    transfer: TransferArg,
}

pub(crate) fn machine(a: MachineArgs) -> ExitCode {
    let m = match a.preset {
        Preset::Dev => Machine::dev_host(a.ranks, a.workers),
        Preset::H100 => Machine::h100_cluster(a.gpus, a.network.network(), a.transfer.transfer()),
    };
    println!("{}", m.to_json());
    ExitCode::SUCCESS
}

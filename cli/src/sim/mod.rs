//! `boundpool sim`: a graph's run on a described machine in virtual time (`boundpool-sim`):
//! the tiled Cholesky on P GPUs or a graph file on R ranks ([`run`]), cost models from traces
//! and machine presets ([`tools`]), the scaling table ([`scaling`]), and the checks against
//! real runs: random host DAGs run here ([`check_host`]) and traces recorded on the device
//! machine ([`check_device`]).

use std::process::ExitCode;

use clap::{Args, Subcommand};

mod check_device;
mod check_host;
mod run;
mod scaling;
mod tools;

#[derive(Args, Debug)]
pub(crate) struct SimArgs {
    #[command(subcommand)]
    command: SimCommand,
}

#[derive(Subcommand, Debug)]
enum SimCommand {
    /// The tiled Cholesky (2D block-cyclic, owner computes) on GPUs: makespan, TFLOP/s, busy
    /// fractions, the critical path, what limits it.
    Cholesky(run::CholeskyArgs),
    /// A graph file (`boundpool run --graph`'s format; nodes may name ranks) on host ranks.
    Graph(run::GraphArgs),
    /// Distributed Cholesky over N and GPU counts, on InfiniBand and Ethernet: the table of
    /// docs/benchmarks.md.
    Scaling(scaling::ScalingArgs),
    /// A cost model (JSON) from a Chrome trace of a real run.
    Costs(tools::CostsArgs),
    /// A machine preset as JSON (edit it, then give it with --machine).
    Machine(tools::MachineArgs),
    /// Random host DAGs run here on 1, 2 and 4 ranks (in-process network) against their
    /// simulation, costs from the one-rank run's trace.
    CheckHost(check_host::CheckHostArgs),
    /// The GPU tiled Cholesky recorded on the device machine (`benches/device/sim_call.sh`)
    /// against its simulation.
    CheckCholesky(check_device::CheckCholeskyArgs),
    /// The served model recorded on the device machine against its simulation.
    CheckServe(check_device::CheckServeArgs),
}

pub(crate) fn main(a: SimArgs) -> ExitCode {
    match a.command {
        SimCommand::Cholesky(a) => run::cholesky(a),
        SimCommand::Graph(a) => run::graph(a),
        SimCommand::Scaling(a) => scaling::main(a),
        SimCommand::Costs(a) => tools::costs(a),
        SimCommand::Machine(a) => tools::machine(a),
        SimCommand::CheckHost(a) => check_host::main(a),
        SimCommand::CheckCholesky(a) => check_device::cholesky(a),
        SimCommand::CheckServe(a) => check_device::serve(a),
    }
}

/// Prints `boundpool sim: MESSAGE` and returns exit status 2 (bad arguments or input).
pub(crate) fn usage(m: impl std::fmt::Display) -> ExitCode {
    eprintln!("boundpool sim: {m}");
    ExitCode::from(2)
}

//! `boundpool sim check-cholesky` and `check-serve`: the device machine's recordings
//! (`benches/device/sim_call.sh`) against their simulation.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::usage;

#[derive(Args, Debug)]
pub(crate) struct CheckCholeskyArgs {
    /// The folder `sim_call.sh` filled.
    dir: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct CheckServeArgs {
    /// The folder `sim_call.sh` filled.
    dir: PathBuf,
}

pub(crate) fn cholesky(a: CheckCholeskyArgs) -> ExitCode {
    usage(format!("{}: not yet", a.dir.display()))
}

pub(crate) fn serve(a: CheckServeArgs) -> ExitCode {
    usage(format!("{}: not yet", a.dir.display()))
}

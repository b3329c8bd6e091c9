//! What the launcher tells a process about itself (a leaf module): which launcher started it,
//! and its rank among the processes of its node (the local rank, which will pick its GPUs).

/// The launcher that started this process, read from its environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// Open MPI's `mpirun`/`mpiexec` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// MPICH's or Intel MPI's Hydra `mpiexec` (`PMI_RANK`, `MPI_LOCALRANKID`).
    Hydra,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_LOCALID`).
    Slurm,
    /// None of these: a single process, or a launcher this crate does not know.
    Unknown,
}

/// The launcher's view of this process: its rank and size as the launcher numbered them, and
/// its local rank (position among the ranks of its node). MPI's own rank and size are what
/// the runtime uses; these are for choosing devices and for messages before MPI starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Which launcher.
    pub launcher: Launcher,
    /// The rank it gave this process, if it said.
    pub rank: Option<usize>,
    /// The number of processes it started, if it said.
    pub size: Option<usize>,
    /// This process's position among the processes on its node, if it said.
    pub local_rank: Option<usize>,
    /// The number of processes on this node, if it said.
    pub local_size: Option<usize>,
}

impl LaunchInfo {
    /// Reads the launcher's environment variables of this process.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads them through `var` (for tests, and for launchers that pass them otherwise).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let num = |k: &str| var(k).and_then(|v| v.trim().parse::<usize>().ok());
        // Open MPI first: it also sets PMIX_* and, under srun, SLURM_* are inherited.
        if let Some(rank) = num("OMPI_COMM_WORLD_RANK") {
            return LaunchInfo {
                launcher: Launcher::OpenMpi,
                rank: Some(rank),
                size: num("OMPI_COMM_WORLD_SIZE"),
                local_rank: num("OMPI_COMM_WORLD_LOCAL_RANK"),
                local_size: num("OMPI_COMM_WORLD_LOCAL_SIZE"),
            };
        }
        if let Some(local) = num("MPI_LOCALRANKID") {
            return LaunchInfo {
                launcher: Launcher::Hydra,
                rank: num("PMI_RANK"),
                size: num("PMI_SIZE"),
                local_rank: Some(local),
                local_size: num("MPI_LOCALNRANKS"),
            };
        }
        if let Some(rank) = num("SLURM_PROCID") {
            return LaunchInfo {
                launcher: Launcher::Slurm,
                rank: Some(rank),
                size: num("SLURM_NTASKS"),
                local_rank: num("SLURM_LOCALID"),
                local_size: num("SLURM_NTASKS_PER_NODE"),
            };
        }
        if let Some(rank) = num("PMI_RANK") {
            return LaunchInfo {
                launcher: Launcher::Hydra,
                rank: Some(rank),
                size: num("PMI_SIZE"),
                local_rank: None,
                local_size: None,
            };
        }
        LaunchInfo {
            launcher: Launcher::Unknown,
            rank: None,
            size: None,
            local_rank: None,
            local_size: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn info(vars: &[(&str, &str)]) -> LaunchInfo {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchInfo::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn open_mpi() {
        let i = info(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("SLURM_PROCID", "0"),
        ]);
        assert_eq!(i.launcher, Launcher::OpenMpi);
        assert_eq!(
            (i.rank, i.size, i.local_rank, i.local_size),
            (Some(3), Some(4), Some(1), Some(2))
        );
    }

    #[test]
    fn hydra_and_slurm() {
        let h = info(&[
            ("PMI_RANK", "5"),
            ("PMI_SIZE", "8"),
            ("MPI_LOCALRANKID", "1"),
        ]);
        assert_eq!(h.launcher, Launcher::Hydra);
        assert_eq!((h.rank, h.local_rank), (Some(5), Some(1)));
        let s = info(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "3"),
        ]);
        assert_eq!(s.launcher, Launcher::Slurm);
        assert_eq!((s.rank, s.size, s.local_rank), (Some(7), Some(8), Some(3)));
    }

    #[test]
    fn nothing_set_is_unknown() {
        let u = info(&[("SLURM_LOCALID", "x")]);
        assert_eq!(u.launcher, Launcher::Unknown);
        assert_eq!(u.local_rank, None);
    }
}

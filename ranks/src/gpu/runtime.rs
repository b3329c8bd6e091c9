//! A rank's runtime over a GPU pool ([`GpuRanks`]): the pool's workers plus the communication
//! thread, the rank's devices, and, with the `nccl` feature, a communicator made at build (its
//! id sent from rank 0 over the ranks' transport by a graph of its own).

use std::ops::Deref;

use boundpool_gpu::{
    call_on, download_on, BoxError, DeviceBuffer, DeviceCopy, Devices, GpuCtx, GpuDevice,
    GpuPoolBuilder, GpuWorker, GroupId,
};

use crate::error::{Error, ErrorKind};
use crate::launch::LaunchInfo;
use crate::ranks::{Ranks, RanksBuilder};
use crate::transport::{LocalNetwork, Transport};

/// Settings of a rank's runtime over a GPU pool: the pool's ([`GpuPoolBuilder`]), the
/// communication thread's ([`RanksBuilder`]: its worker count is not used, the pool has its
/// own), which device each local rank takes, and NCCL.
#[derive(Debug)]
pub struct GpuRanksBuilder {
    ranks: RanksBuilder,
    pool: GpuPoolBuilder,
    by_local_rank: bool,
    nccl: bool,
    nccl_device: usize,
}

impl GpuRanksBuilder {
    /// A runtime over a pool built from `pool`, with the communication settings of `ranks`.
    pub fn new(ranks: RanksBuilder, pool: GpuPoolBuilder) -> Self {
        GpuRanksBuilder {
            ranks,
            pool,
            by_local_rank: false,
            nccl: false,
            nccl_device: 0,
        }
    }

    /// Each process uses one device, chosen by its local rank (the launcher's:
    /// `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID`): local rank `l` of a
    /// node with `d` devices takes device `l mod d` (so two ranks on a one-GPU machine share
    /// it). Overrides the pool's device list.
    pub fn device_by_local_rank(mut self, on: bool) -> Self {
        self.by_local_rank = on;
        self
    }

    /// Makes an NCCL communicator over the ranks at build (feature `nccl`): one per rank, on
    /// its device number [`nccl_device`](Self::nccl_device) of the pool (NCCL rank = the
    /// rank), its id made by rank 0 and sent over the ranks' transport. Device values of that
    /// device then cross ranks with `ncclSend`/`ncclRecv`, and collectives can be added. A
    /// missing libnccl fails the build, naming the files tried. Two ranks on one GPU need a
    /// distinct `NCCL_HOSTID` each (NCCL refuses a duplicate GPU otherwise).
    #[cfg(feature = "nccl")]
    pub fn nccl(mut self, on: bool) -> Self {
        self.nccl = on;
        self
    }

    /// Which of the pool's devices (by position) holds the rank's NCCL communicator (0 by
    /// default).
    #[cfg(feature = "nccl")]
    pub fn nccl_device(mut self, index: usize) -> Self {
        self.nccl_device = index;
        self
    }

    /// Builds rank `rank` of an in-process network (ranks as threads of one process).
    pub fn build_local(self, net: &LocalNetwork, rank: usize) -> Result<GpuRanks, Error> {
        let t = net.endpoint(rank);
        self.build_with(move || Ok(t))
    }

    /// Builds this process's rank over MPI (started by `mpirun`, `mpiexec` or `srun`).
    #[cfg(feature = "mpi")]
    pub fn build_mpi(self) -> Result<GpuRanks, Error> {
        self.build_with(crate::transport::MpiTransport::init)
    }

    /// Builds the runtime on the transport `make` returns (called on the communication
    /// thread): the GPU pool first (its workers bind their devices), then the communication
    /// thread, then the NCCL communicator if asked.
    pub fn build_with<T, F>(self, make: F) -> Result<GpuRanks, Error>
    where
        T: Transport + 'static,
        F: FnOnce() -> Result<T, Error> + Send + 'static,
    {
        let mut pool = self.pool;
        if self.by_local_rank {
            let local = LaunchInfo::from_env().local_rank.unwrap_or(0);
            let count = boundpool_gpu::device_count().map_err(gpu_error)?;
            if count == 0 {
                return Err(Error::new(
                    ErrorKind::Gpu,
                    "device_by_local_rank: the driver reports no device",
                ));
            }
            pool = pool.devices(Devices::List(vec![(local % count) as i32]));
        }
        #[cfg(feature = "nccl")]
        {
            pool = pool.nccl(self.nccl);
        }
        let gpu = pool.build().map_err(gpu_error)?;
        let devices = gpu.devices().to_vec();
        if self.nccl && self.nccl_device >= devices.len() {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "nccl_device({}) of a pool of {} devices",
                    self.nccl_device,
                    devices.len()
                ),
            ));
        }
        let host_group = gpu.host_group();
        let ranks = Ranks::from_pool_with(gpu.into_pool(), None, &self.ranks, make)?;
        let out = GpuRanks {
            ranks,
            devices,
            host_group,
            nccl_device: self.nccl.then_some(self.nccl_device),
        };
        #[cfg(feature = "nccl")]
        if self.nccl {
            let device = out
                .nccl_device()
                .expect("a communicator is asked for on a device");
            crate::gpu::bootstrap::make_communicator(&out.ranks, device)?;
        }
        Ok(out)
    }
}

/// A `boundpool-gpu` error as this crate's ([`ErrorKind::Gpu`], the GPU error as `source()`).
pub(crate) fn gpu_error(e: boundpool_gpu::GpuError) -> Error {
    Error::new(ErrorKind::Gpu, e.to_string()).with_source(e)
}

/// One rank's runtime over a GPU pool: a [`Ranks`] whose pool's workers are bound to the rank's
/// devices (it dereferences to it: submit, run, rank, size), the devices, and their NCCL
/// communicator if it was made. Build its graphs' GPU nodes with
/// [`RankGraphBuilder::gpu_node`](crate::RankGraphBuilder::gpu_node) and
/// [`device_node`](crate::RankGraphBuilder::device_node), on [`devices`](Self::devices).
pub struct GpuRanks {
    ranks: Ranks<GpuWorker>,
    devices: Vec<GpuDevice>,
    host_group: Option<GroupId>,
    nccl_device: Option<usize>,
}

impl std::fmt::Debug for GpuRanks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRanks")
            .field("ranks", &self.ranks)
            .field("devices", &self.devices)
            .field("nccl_device", &self.nccl_device)
            .finish()
    }
}

impl Deref for GpuRanks {
    type Target = Ranks<GpuWorker>;

    fn deref(&self) -> &Ranks<GpuWorker> {
        &self.ranks
    }
}

impl GpuRanks {
    /// The rank's devices, in the pool's order.
    pub fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    /// The device of the rank's NCCL communicator, if one was made.
    pub fn nccl_device(&self) -> Option<&GpuDevice> {
        self.nccl_device.map(|i| &self.devices[i])
    }

    /// The pool's host group, if it has one.
    pub fn host_group(&self) -> Option<GroupId> {
        self.host_group
    }

    /// Runs `f` as a one-node graph on a worker of `device` (a device of this rank) and
    /// returns its result (this rank only: no other rank takes part).
    pub fn call<T, F>(&self, device: &GpuDevice, f: F) -> Result<T, Error>
    where
        T: Send + Sync + 'static,
        F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        call_on(self.ranks.pool(), device, f).map_err(gpu_error)
    }

    /// Copies `buf` (a buffer of one of this rank's devices: a run's output, say) to the host.
    pub fn download<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>) -> Result<Vec<T>, Error> {
        let device = self
            .devices
            .iter()
            .find(|d| d.ordinal() == buf.device_ordinal())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "a buffer of device {}, not this rank's",
                        buf.device_ordinal()
                    ),
                )
            })?;
        download_on(self.ranks.pool(), device, buf).map_err(gpu_error)
    }
}

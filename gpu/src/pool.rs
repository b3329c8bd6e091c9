//! Building a pool of context-bound workers, one group (or several) per device.

use std::fmt;
use std::sync::Arc;

use boundpool_scheduler::backend::{FromIndex, PoolBuilderExt, PoolExt};
use boundpool_scheduler::{
    BoxError, Cores, DomainId, Graph, GraphBuilder, GraphHandle, GroupId, GroupSpec, Placement,
    Pool, PoolBuilder, ShutdownMode,
};

use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::detect::{self, plan_cores, process_cores};
use crate::device::{DeviceInfo, DeviceShared, GpuDevice};
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::{GpuCtx, GpuGraphExt};
use crate::partition::{DevicePartitions, PartitionInfo, SmPartition};
use crate::worker::{GpuWorker, PoolShared};

/// Which devices a pool uses.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Devices {
    /// Every device the driver reports.
    #[default]
    All,
    /// These CUDA ordinals, in this order.
    List(Vec<i32>),
}

/// Configures a [`GpuPool`].
///
/// # Examples
///
/// Compiled, not run here (it needs a GPU); `tests/gpu_*.rs` build pools and skip without one.
///
/// ```no_run
/// use boundpool_gpu::GpuPoolBuilder;
/// let pool = GpuPoolBuilder::new().workers_per_device(4).build()?;
/// # Ok::<(), boundpool_gpu::GpuError>(())
/// ```
#[derive(Clone, Debug)]
pub struct GpuPoolBuilder {
    name: String,
    devices: Devices,
    workers_per_device: usize,
    groups_per_device: usize,
    device_cores: Vec<(i32, Vec<usize>)>,
    pin: bool,
    host_workers: usize,
    host_cores: Option<Cores>,
    trace: bool,
    stream_handoff: bool,
    plan: crate::state::WorkerPlan,
    /// (group index within a device, stream priority)
    stream_priorities: Vec<(usize, i32)>,
    wait_spin: std::time::Duration,
    idle_spin: Option<std::time::Duration>,
    paced_spin: Option<std::time::Duration>,
    spinning_waiters: Option<usize>,
    partitions: Vec<SmPartition>,
    /// Check that libnccl loads when building (feature `nccl`).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    nccl: bool,
}

impl Default for GpuPoolBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GpuPoolBuilder {
    /// All devices, 4 workers per device, pinned to GPU-local cores where the system says which,
    /// no host group.
    pub fn new() -> Self {
        Self {
            name: "gpu".into(),
            devices: Devices::All,
            workers_per_device: 4,
            groups_per_device: 1,
            device_cores: Vec::new(),
            pin: true,
            host_workers: 0,
            host_cores: None,
            trace: false,
            stream_handoff: true,
            plan: Default::default(),
            stream_priorities: Vec::new(),
            wait_spin: std::time::Duration::ZERO,
            idle_spin: None,
            paced_spin: None,
            spinning_waiters: None,
            partitions: Vec::new(),
            nccl: false,
        }
    }

    /// The pool's nodes will use NCCL (feature `nccl`): `build` fails with a
    /// [`GpuErrorKind::LibraryMissing`] error naming the files tried when libnccl cannot be
    /// loaded, instead of the first NCCL node. The communicators themselves are made by nodes
    /// ([`GpuCtx::nccl_init`](crate::GpuCtx::nccl_init)), once the ranks have an id to share.
    #[cfg(feature = "nccl")]
    pub fn nccl(mut self, on: bool) -> Self {
        self.nccl = on;
        self
    }

    /// The pool's name (thread names, errors).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Which devices to use.
    pub fn devices(mut self, devices: Devices) -> Self {
        self.devices = devices;
        self
    }

    /// Bound workers per device (each with its own stream). At least one.
    pub fn workers_per_device(mut self, n: usize) -> Self {
        self.workers_per_device = n;
        self
    }

    /// Splits each device's workers into `n` groups (`gpu<ordinal>` when 1, else
    /// `gpu<ordinal>.<i>`), so that nodes can be placed on part of a device's workers (for
    /// example to force consecutive nodes onto different streams). Default 1. Nodes placed on
    /// the device itself ([`GpuGraphExt::gpu_node`], [`GpuDevice::placement`]) still run on
    /// any of its workers: with more than one group, the device is a scheduler domain
    /// (`gpu<ordinal>`) over its groups.
    pub fn groups_per_device(mut self, n: usize) -> Self {
        self.groups_per_device = n;
        self
    }

    /// The cores of device `ordinal`'s workers (one per worker, in turn), instead of the default.
    pub fn device_cores(mut self, ordinal: i32, cores: Vec<usize>) -> Self {
        self.device_cores.retain(|(o, _)| *o != ordinal);
        self.device_cores.push((ordinal, cores));
        self
    }

    /// Do not pin workers to cores.
    pub fn unpinned(mut self) -> Self {
        self.pin = false;
        self
    }

    /// Adds a group named `host` of `n` unbound workers for host nodes (0: none, the default;
    /// host nodes then run on device workers).
    pub fn host_workers(mut self, n: usize, cores: Cores) -> Self {
        self.host_workers = n;
        self.host_cores = Some(cores);
        self
    }

    /// Whether a GPU node whose one GPU successor is on the same device hands its stream over
    /// to it (on by default): the successor enqueues on that stream, whichever worker runs it,
    /// so the edge costs no event record and wait. Off: every worker enqueues only on its own
    /// stream and such edges cost an event (recorded eagerly when the successor is placed on
    /// another group, else by the worker that steals the successor), which leaves a chain's
    /// work free to move to the stream of whichever worker runs it.
    pub fn stream_handoff(mut self, on: bool) -> Self {
        self.stream_handoff = on;
        self
    }

    /// Records a timeline ([`GpuPool::take_trace`]): the scheduler's worker tracks, plus one
    /// track per GPU stream (`GPU <ordinal> (<name>) stream <i>`) with each GPU node's device
    /// time, measured with timing events. Off by default; when off no timing event exists.
    pub fn trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    /// How long a thread off the pool waiting for a graph or a replayed run watches for its
    /// end before it parks ([`PoolBuilder::wait_spin`](boundpool_scheduler::PoolBuilder::wait_spin);
    /// default zero). A serving client whose requests take tens of microseconds saves the
    /// wake-up of a park with a few tens of microseconds here.
    pub fn wait_spin(mut self, spin: std::time::Duration) -> Self {
        self.wait_spin = spin;
        self
    }

    /// How long a worker that ran out of work watches before it parks
    /// ([`PoolBuilder::idle_spin`](boundpool_scheduler::PoolBuilder::idle_spin); default 20 µs).
    pub fn idle_spin(mut self, spin: std::time::Duration) -> Self {
        self.idle_spin = Some(spin);
        self
    }

    /// How long one worker of each group (each SM partition) may watch past the idle spin
    /// when its work comes at a steady pace, as a server's requests do
    /// ([`PoolBuilder::paced_spin`](boundpool_scheduler::PoolBuilder::paced_spin); default
    /// 1 ms where the pool's workers leave two of the process's cores or more to other
    /// threads, zero otherwise).
    pub fn paced_spin(mut self, max: std::time::Duration) -> Self {
        self.paced_spin = Some(max);
        self
    }

    /// At most `n` waiters of normal- and low-level graphs spin at once
    /// ([`PoolBuilder::spinning_waiters`](boundpool_scheduler::PoolBuilder::spinning_waiters);
    /// default: the cores this process may use, less the pool's workers, less one).
    pub fn spinning_waiters(mut self, n: usize) -> Self {
        self.spinning_waiters = Some(n);
        self
    }

    /// Creates each device worker's cuBLAS handle when it starts (else at its first
    /// [`GpuCtx::cublas`]); a libcublas the loader cannot find is then an error of `build`.
    pub fn blas(mut self, at_start: bool) -> Self {
        self.plan.blas = at_start;
        self
    }

    /// Creates each device worker's cuSOLVER handle when it starts (else at its first
    /// [`GpuCtx::solver`]); a missing libcusolver is then an error of `build`.
    pub fn solver(mut self, at_start: bool) -> Self {
        self.plan.solver = at_start;
        self
    }

    /// A value of type `T` made by `make` on each device worker when it starts (its context
    /// bound, after the libraries asked for up front), dropped on that worker when it stops
    /// (context still bound), reachable from node bodies as [`GpuCtx::state`]: cuFFT plans,
    /// other libraries' handles, scratch buffers. A factory's error fails `build`, naming the
    /// worker. One state per type (a second factory for the same type replaces the first).
    pub fn worker_state<T, F>(mut self, make: F) -> Self
    where
        T: Send + 'static,
        F: Fn(&crate::state::WorkerSetup<'_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let m = crate::state::StateMaker::new::<T, F>(make);
        self.plan
            .states
            .retain(|o| o.state_type() != m.state_type());
        self.plan.states.push(m);
        self
    }

    /// The CUDA priority of the streams of the workers of each device's group `group` (see
    /// [`groups_per_device`](Self::groups_per_device)): lower is more urgent, 0 is the default,
    /// clamped to the device's range (on current GPUs down to -5). Work on a higher-priority
    /// stream gets the device's free SMs first (for example the critical path of a
    /// factorization, placed on its own group, ahead of bulk updates).
    pub fn stream_priority(mut self, group: usize, priority: i32) -> Self {
        self.stream_priorities.retain(|(g, _)| *g != group);
        self.stream_priorities.push((group, priority));
        self
    }

    /// Splits each device's SMs into disjoint partitions, each a worker group
    /// (`gpu<ordinal>.<name>`) whose workers make all their streams in the partition's green
    /// context: their work runs on its SMs only, so a latency-critical path placed there
    /// ([`GpuDevice::partition`]) never waits for SMs behind bulk work elsewhere. Sizes are
    /// exact: a count the device cannot give (under its smallest partition, between two of its
    /// steps, more than it has) fails `build` naming the partition; [`SmPartition::rest`] takes
    /// what the others leave, and without one those SMs stay unused
    /// ([`GpuDevice::unused_sms`]). The partitions' workers are the device's workers
    /// (`workers_per_device` and `groups_per_device` do not apply;
    /// [`stream_priority`](Self::stream_priority) takes a partition's index). Nodes placed on the device run on
    /// any partition's workers. Needs a CUDA 12.5 driver or newer. Empty (the default): no
    /// partitions, the device as a whole.
    ///
    /// ```no_run
    /// use boundpool_gpu::{GpuPoolBuilder, SmPartition};
    /// let pool = GpuPoolBuilder::new()
    ///     .sm_partitions(vec![SmPartition::new("latency", 8), SmPartition::rest("bulk").workers(3)])
    ///     .build()?;
    /// let latency = pool.devices()[0].partition("latency").unwrap().placement();
    /// # let _ = latency;
    /// # Ok::<(), boundpool_gpu::GpuError>(())
    /// ```
    pub fn sm_partitions(mut self, partitions: Vec<SmPartition>) -> Self {
        self.partitions = partitions;
        self
    }

    /// The workers of each device: the partitions' when there are any.
    fn device_workers(&self) -> usize {
        if self.partitions.is_empty() {
            self.workers_per_device
        } else {
            self.partitions.iter().map(SmPartition::worker_count).sum()
        }
    }

    /// Device `ordinal`'s groups: (name, first worker, end, SM partition) of each, a group per
    /// partition, else the device's workers split as evenly as possible.
    fn device_groups(&self, ordinal: i32) -> Vec<(String, usize, usize, Option<usize>)> {
        if self.partitions.is_empty() {
            let g = self.groups_per_device;
            return (0..g)
                .map(|k| {
                    let lo = k * self.workers_per_device / g;
                    let hi = (k + 1) * self.workers_per_device / g;
                    let name = if g == 1 {
                        format!("gpu{ordinal}")
                    } else {
                        format!("gpu{ordinal}.{k}")
                    };
                    (name, lo, hi, None)
                })
                .collect();
        }
        let mut lo = 0;
        self.partitions
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let hi = lo + p.worker_count();
                let group = (format!("gpu{ordinal}.{}", p.name()), lo, hi, Some(k));
                lo = hi;
                group
            })
            .collect()
    }

    /// Detects the devices (an error, not a panic, when there is no driver or no such device),
    /// then starts the workers: each pins itself, binds its device's primary context (retained
    /// once per device), checks it with `cuCtxGetCurrent` and creates its stream.
    pub fn build(self) -> GpuResult<GpuPool> {
        #[cfg(feature = "nccl")]
        if self.nccl {
            crate::nccl::comm::check_library(&format!("building GPU pool '{}'", self.name))?;
        }
        let ordinals = self.ordinals()?;
        self.plan.check_libraries()?;
        let (devices, infos) = self.open_devices(&ordinals)?;
        let groups = self.plan_groups(&devices, &infos);
        let shared = Arc::new(PoolShared {
            group_device: groups.group_device,
            domain_device: groups.domain_device,
            devices: devices.clone(),
            stream_handoff: self.stream_handoff,
            plan: self.plan.clone(),
            group_priority: groups.group_priority,
            group_partition: groups.group_partition,
            first_start_failure: std::sync::Mutex::new(None),
        });
        let pool = self.start(shared, groups.specs, &devices, &groups.device_groups)?;
        Ok(self.finish(pool, devices, groups.device_groups, groups.host_group))
    }

    /// The ordinals of the devices to use, checked against the driver's count.
    fn ordinals(&self) -> GpuResult<Vec<i32>> {
        let count = detect::detect()?;
        if count == 0 {
            return Err(GpuError::new(
                GpuErrorKind::NoDevice,
                "the CUDA driver reports no device",
            ));
        }
        let ordinals: Vec<i32> = match &self.devices {
            Devices::All => (0..count as i32).collect(),
            Devices::List(v) => v.clone(),
        };
        if ordinals.is_empty() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                "no device selected",
            ));
        }
        if self.workers_per_device == 0 || self.groups_per_device == 0 {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                "workers_per_device and groups_per_device must be at least 1",
            ));
        }
        if !self.partitions.is_empty() && self.groups_per_device > 1 {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                "groups_per_device and sm_partitions cannot be combined: each SM partition is a group",
            ));
        }
        crate::partition::check_specs(&self.partitions)?;
        if self.groups_per_device > self.workers_per_device {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                "groups_per_device cannot exceed workers_per_device",
            ));
        }
        let mut seen = Vec::new();
        for &o in &ordinals {
            if o < 0 || o as usize >= count {
                return Err(GpuError::new(
                    GpuErrorKind::NoDevice,
                    format!("device {o} does not exist (the driver reports {count} device(s))"),
                ));
            }
            if seen.contains(&o) {
                return Err(GpuError::new(
                    GpuErrorKind::InvalidArgument,
                    format!("device {o} listed twice"),
                ));
            }
            seen.push(o);
        }
        Ok(ordinals)
    }

    /// Opens each device (its table, with its metrics) and returns them with their facts.
    fn open_devices(
        &self,
        ordinals: &[i32],
    ) -> GpuResult<(Vec<Arc<DeviceShared>>, Vec<DeviceInfo>)> {
        let mut devices = Vec::new();
        let mut infos = Vec::new();
        for &o in ordinals {
            let (dev, info) = detect::open_device(o)?;
            infos.push(info.clone());
            let mut d = DeviceShared::new(info, dev, self.trace);
            if !self.partitions.is_empty() {
                let what = format!("device {o} ({})", d.info.name);
                let (planned, unused) =
                    crate::partition::split_device(dev, &what, &self.partitions)?;
                let sizes: Vec<(&str, u32)> =
                    planned.iter().map(|p| (p.name.as_str(), p.sms)).collect();
                crate::metrics::register_partitions(&self.name, o, &sizes, unused);
                d = d.with_partitions(DevicePartitions::new(planned, unused));
            } else {
                crate::metrics::register_partitions(&self.name, o, &[("all", d.info.sms)], 0);
            }
            d.set_metrics(crate::metrics::DeviceMetrics::register(
                &self.name,
                d.ordinal(),
            ));
            devices.push(Arc::new(d));
        }
        Ok((devices, infos))
    }

    /// The scheduler groups: `groups_per_device` per device (their workers' cores and stream
    /// priority), then the host group if any.
    fn plan_groups(&self, devices: &[Arc<DeviceShared>], infos: &[DeviceInfo]) -> GroupPlan {
        let process = process_cores();
        let plans = plan_cores(infos, self.device_workers(), &process);
        let mut specs = Vec::new();
        let mut group_device = Vec::new();
        let mut group_priority = Vec::new();
        let mut group_partition = Vec::new();
        let mut device_groups: Vec<Vec<GroupId>> = vec![Vec::new(); devices.len()];
        // With one group per device the group is the device's placement; with more, a domain
        // over them (domain k is device k's).
        let mut domain_device = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let cores = self
                .device_cores
                .iter()
                .find(|(o, _)| *o == d.ordinal())
                .map(|(_, c)| c.clone())
                .unwrap_or_else(|| plans[i].clone());
            let split = self.device_groups(d.ordinal());
            for (k, (name, lo, hi, partition)) in split.into_iter().enumerate() {
                let cores = if !self.pin {
                    Cores::Unpinned
                } else if cores.is_empty() {
                    Cores::All
                } else {
                    Cores::List((lo..hi).map(|w| cores[w % cores.len()]).collect())
                };
                device_groups[i].push(GroupId::from_index(specs.len()));
                group_device.push(Some(i));
                group_partition.push(partition);
                group_priority.push(
                    self.stream_priorities
                        .iter()
                        .find(|(gi, _)| *gi == k)
                        .map_or(0, |(_, p)| *p),
                );
                specs.push(GroupSpec {
                    name,
                    workers: hi - lo,
                    cores,
                });
            }
        }
        let host_group = if self.host_workers > 0 {
            let id = GroupId::from_index(specs.len());
            group_device.push(None);
            group_partition.push(None);
            group_priority.push(0);
            specs.push(GroupSpec {
                name: "host".into(),
                workers: self.host_workers,
                cores: if self.pin {
                    self.host_cores.clone().unwrap_or_default()
                } else {
                    Cores::Unpinned
                },
            });
            Some(id)
        } else {
            None
        };
        if self.groups_per_device > 1 || self.partitions.len() > 1 {
            domain_device.extend(0..devices.len());
        }
        GroupPlan {
            specs,
            group_device,
            group_priority,
            group_partition,
            device_groups,
            domain_device,
            host_group,
        }
    }

    /// Starts the scheduler pool: each device worker's start hook binds its device and sets
    /// it up; a failed start names the first device worker that failed.
    fn start(
        &self,
        shared: Arc<PoolShared>,
        specs: Vec<GroupSpec>,
        devices: &[Arc<DeviceShared>],
        device_groups: &[Vec<GroupId>],
    ) -> GpuResult<Pool<GpuWorker>> {
        let sh_start = shared.clone();
        let sh_failed = shared.clone();
        let pool_name = self.name.clone();
        let mut builder = PoolBuilder::new().name(&self.name).groups(specs);
        if let Some(n) = self.spinning_waiters {
            builder = builder.spinning_waiters(n);
        }
        if let Some(spin) = self.idle_spin {
            builder = builder.idle_spin(spin);
        }
        if let Some(max) = self.paced_spin {
            builder = builder.paced_spin(max);
        }
        if self.groups_per_device > 1 || self.partitions.len() > 1 {
            for (i, d) in devices.iter().enumerate() {
                builder = builder.domain(format!("gpu{}", d.ordinal()), device_groups[i].clone());
            }
        }
        let pool = builder
            .thread_name(move |info| {
                format!("{pool_name}-{}-{}", info.group_name, info.index_in_group)
            })
            .start_hook(move |info| -> Result<GpuWorker, BoxError> {
                match sh_start.device_of_group(info.group) {
                    Some(d) => {
                        // A worker's start makes library handles, pinned words and (in user
                        // states) modules, which may synchronise the device: never while a
                        // stream of another thread captures on it (`gate.rs`).
                        let _gate = sh_start.devices[d].gate.sync();
                        let priority = sh_start.group_priority[info.group.index()];
                        let partition = sh_start.partition_of_group(info.group);
                        GpuWorker::start_device(sh_start.clone(), d, priority, partition)
                            .and_then(|w| w.set_up(info))
                            .map_err(|e| {
                                if e.kind() != GpuErrorKind::Closed {
                                    let mut first = sh_start
                                        .first_start_failure
                                        .lock()
                                        .unwrap_or_else(|p| p.into_inner());
                                    if first.is_none() {
                                        *first = Some((info.name.clone(), e.to_string()));
                                    }
                                }
                                Box::new(e) as BoxError
                            })
                    }
                    None => Ok(GpuWorker::host(sh_start.clone())),
                }
            })
            .stop_hook(|_, w: GpuWorker| w.stop())
            .idle_hook(|_, w: &GpuWorker| w.idle())
            .trace(self.trace)
            .wait_spin(self.wait_spin)
            .build()
            .map_err(|e| {
                let first = sh_failed
                    .first_start_failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                let msg = e.to_string();
                let msg = match first {
                    Some((worker, why)) if !msg.contains(&why) => {
                        format!("{msg} (the first device worker to fail: '{worker}': {why})")
                    }
                    _ => msg,
                };
                GpuError::new(
                    GpuErrorKind::Scheduler,
                    format!("starting the GPU pool: {msg}"),
                )
                .with_source(e)
            })?;
        Ok(pool)
    }

    /// The started pool's devices: the trace's recorder, each device's waker for its release
    /// queue, and its public face.
    fn finish(
        &self,
        pool: Pool<GpuWorker>,
        devices: Vec<Arc<DeviceShared>>,
        device_groups: Vec<Vec<GroupId>>,
        host_group: Option<GroupId>,
    ) -> GpuPool {
        if let Some(r) = pool.span_recorder() {
            for d in &devices {
                if let Some(t) = &d.timing {
                    t.set_recorder(r.clone());
                }
            }
        }
        let placements: Vec<Placement> = (0..devices.len())
            .map(|i| {
                if device_groups[i].len() > 1 {
                    Placement::Domain(DomainId::from_index(i))
                } else {
                    Placement::Group(device_groups[i][0])
                }
            })
            .collect();
        for (i, d) in devices.iter().enumerate() {
            // A handle dropped anywhere is released by whichever of the device's workers comes
            // first.
            let waker = match placements[i] {
                Placement::Domain(dom) => pool.domain_waker(dom),
                _ => pool.group_waker(device_groups[i][0]),
            };
            d.set_waker(Box::new(move || waker.wake()));
        }
        let named: Vec<(i32, usize, &str)> = pool
            .workers()
            .iter()
            .filter_map(|w| {
                let d = device_index_of(&device_groups, w.group)?;
                let part = devices[d]
                    .partitions
                    .planned
                    .get(device_groups[d].iter().position(|g| *g == w.group)?)
                    .map_or("all", |p| p.name.as_str());
                Some((devices[d].ordinal(), w.index, part))
            })
            .collect();
        crate::metrics::register_workers(&self.name, &named);
        let gdevices = devices
            .into_iter()
            .zip(device_groups)
            .zip(placements)
            .map(|((shared, groups), placement)| {
                let partitions = shared
                    .partitions
                    .planned
                    .iter()
                    .zip(&groups)
                    .zip(&self.partitions)
                    .map(|((p, &group), spec)| PartitionInfo {
                        name: p.name.clone(),
                        sms: p.sms,
                        group,
                        workers: spec.worker_count(),
                    })
                    .collect();
                GpuDevice {
                    shared,
                    groups,
                    placement,
                    partitions,
                }
            })
            .collect();
        GpuPool {
            pool,
            devices: gdevices,
            host_group,
        }
    }
}

/// The device (index into the pool's devices) whose groups include `g`.
fn device_index_of(device_groups: &[Vec<GroupId>], g: GroupId) -> Option<usize> {
    device_groups.iter().position(|gs| gs.contains(&g))
}

/// The scheduler groups of a pool, as `GpuPoolBuilder::build` plans them.
struct GroupPlan {
    specs: Vec<GroupSpec>,
    /// Group index -> index into the devices (None: the host group).
    group_device: Vec<Option<usize>>,
    /// Group index -> priority of its workers' streams.
    group_priority: Vec<i32>,
    /// Group index -> the SM partition of its device it is.
    group_partition: Vec<Option<usize>>,
    /// Each device's groups.
    device_groups: Vec<Vec<GroupId>>,
    /// Domain index -> index into the devices (with several groups per device).
    domain_device: Vec<usize>,
    host_group: Option<GroupId>,
}

/// A pool of pinned workers bound to their devices' contexts (plus optional host workers),
/// running graphs whose GPU nodes are made with [`GpuGraphExt`].
pub struct GpuPool {
    pool: Pool<GpuWorker>,
    devices: Vec<GpuDevice>,
    host_group: Option<GroupId>,
}

impl fmt::Debug for GpuPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuPool")
            .field("devices", &self.devices)
            .field("workers", &self.pool.workers().len())
            .finish()
    }
}

/// The state type of a GPU pool's graphs.
pub type GpuGraph = Graph<GpuWorker>;
/// The builder of a GPU pool's graphs.
pub type GpuGraphBuilder = GraphBuilder<GpuWorker>;

impl GpuPool {
    /// The pool's devices, in the order asked for.
    pub fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    /// The device with CUDA ordinal `ordinal`, if the pool uses it.
    pub fn device(&self, ordinal: i32) -> Option<&GpuDevice> {
        self.devices.iter().find(|d| d.ordinal() == ordinal)
    }

    /// The host group, if the pool has one.
    pub fn host_group(&self) -> Option<GroupId> {
        self.host_group
    }

    /// The scheduler pool underneath (stats, workers, shutdown).
    pub fn pool(&self) -> &Pool<GpuWorker> {
        &self.pool
    }

    /// The scheduler pool underneath, by value, for a runtime that owns a pool of its own
    /// (`boundpool-ranks` runs its ranks on one): keep [`devices`](Self::devices) and
    /// [`host_group`](Self::host_group) first. Dropping the pool shuts it down as dropping this
    /// one would.
    pub fn into_pool(self) -> Pool<GpuWorker> {
        self.pool
    }

    /// Submits a graph. Fails at once, saying why, if a device the pool uses has failed and the
    /// graph places nodes on it.
    pub fn submit(&self, graph: &GpuGraph) -> GpuResult<GraphHandle> {
        for d in &self.devices {
            if let Some(why) = d.shared.failed() {
                let uses = graph
                    .nodes()
                    .any(|n| graph.placement(n).is_some_and(|p| d.serves(p)));
                if uses {
                    return Err(GpuError::new(
                        GpuErrorKind::DeviceFailed,
                        format!(
                            "graph '{}' places nodes on device {}, which failed earlier: {why}",
                            graph.name(),
                            d.ordinal()
                        ),
                    ));
                }
            }
        }
        self.pool
            .submit(graph)
            .map_err(|e| GpuError::new(GpuErrorKind::Scheduler, e.to_string()).with_source(e))
    }

    /// Runs `f` as a one-node graph on a worker of `device` and returns its result: "call and
    /// get a result" without a channel of its own.
    pub fn call<T, F>(&self, device: &GpuDevice, f: F) -> GpuResult<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        call_on(&self.pool, device, f)
    }

    /// Copies a device buffer to the host, on a worker of its device.
    pub fn download<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>) -> GpuResult<Vec<T>> {
        let dev = self
            .devices
            .iter()
            .find(|d| Arc::ptr_eq(&d.shared, &buf.device))
            .ok_or_else(|| {
                GpuError::new(
                    GpuErrorKind::InvalidArgument,
                    "buffer belongs to another pool",
                )
            })?;
        download_on(&self.pool, dev, buf)
    }

    /// Drains the timeline recorded so far (empty unless built with
    /// [`GpuPoolBuilder::trace`]): the worker tracks, and the GPU stream tracks with every GPU
    /// node whose work was enqueued before this call (it first waits, on a worker of each device,
    /// for that work's timing events; that worker's track shows a `trace flush` node of graph
    /// `gpu trace flush`). [`Pool::take_trace`](boundpool_scheduler::Pool::take_trace) alone may miss GPU slices not resolved yet.
    pub fn take_trace(&self) -> boundpool_scheduler::Trace {
        if self.pool.is_tracing() {
            let mut g = GraphBuilder::new("gpu trace flush");
            for d in &self.devices {
                if d.shared.failed().is_some() {
                    continue;
                }
                let n = g.node(
                    "trace flush",
                    |node: &boundpool_scheduler::NodeCtx<'_, GpuWorker>| {
                        if let Some(b) = &node.worker_state().bound {
                            if let Some(t) = &b.device.timing {
                                t.resolve(b.ctx, true);
                            }
                        }
                        Ok(())
                    },
                );
                g.place(n, d.placement());
            }
            // After shutdown there is nothing to flush: each worker resolved its device's
            // pending slices as it stopped.
            if let Ok(graph) = g.build() {
                if let Ok(h) = self.pool.submit(&graph) {
                    let _ = h.wait();
                }
            }
        }
        self.pool.take_trace()
    }

    /// Stops the pool: `Finish` lets submitted graphs end, `Cancel` fails them. Workers then run
    /// their stop hooks: they free what their devices still hold and release the contexts.
    pub fn shutdown(&self, mode: ShutdownMode) {
        self.pool.shutdown(mode)
    }
}

/// [`GpuPool::call`] on the scheduler pool of a GPU pool that a runtime took over with
/// [`GpuPool::into_pool`] (`boundpool-ranks` does): `f` as a one-node graph on a worker of
/// `device`, one of that pool's devices.
pub fn call_on<T, F>(pool: &Pool<GpuWorker>, device: &GpuDevice, f: F) -> GpuResult<T>
where
    T: Send + Sync + 'static,
    F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
{
    if let Some(why) = device.shared.failed() {
        return Err(GpuError::new(
            GpuErrorKind::DeviceFailed,
            format!("device {} failed earlier: {why}", device.ordinal()),
        ));
    }
    let mut g = GraphBuilder::new("call");
    let n = g.gpu_node(device, "call", f);
    let graph = g
        .build()
        .map_err(|e| GpuError::new(GpuErrorKind::Scheduler, e.to_string()).with_source(e))?;
    let mut out = pool
        .submit(&graph)
        .map_err(scheduler_error)?
        .wait()
        .map_err(scheduler_error)?;
    out.take(n)
        .ok_or_else(|| GpuError::new(GpuErrorKind::Scheduler, "call produced no output"))
}

/// [`GpuPool::download`] on a scheduler pool taken over with [`GpuPool::into_pool`]: `buf`, a
/// buffer of `device`, copied to the host on a worker of it.
pub fn download_on<T: DeviceCopy>(
    pool: &Pool<GpuWorker>,
    device: &GpuDevice,
    buf: &DeviceBuffer<T>,
) -> GpuResult<Vec<T>> {
    if !Arc::ptr_eq(&device.shared, &buf.device) {
        return Err(GpuError::new(
            GpuErrorKind::InvalidArgument,
            format!(
                "a buffer of device {} downloaded on device {}",
                buf.device.ordinal(),
                device.ordinal()
            ),
        ));
    }
    let (ptr, len) = (buf.device_ptr(), buf.len());
    // The caller's borrow of `buf` keeps the allocation alive until `call_on` returns.
    call_on(
        pool,
        device,
        move |ctx| Ok(ctx.download_raw::<T>(ptr, len)?),
    )
}

fn scheduler_error(e: boundpool_scheduler::Error) -> GpuError {
    GpuError::new(GpuErrorKind::Scheduler, e.to_string()).with_source(e)
}

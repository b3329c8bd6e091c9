//! The machine a graph is simulated on: hosts, cores, GPUs, each rank's worker groups, the
//! scheduler's and the communication thread's costs, and the links as latency + bandwidth
//! (a leaf module; JSON through serde).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{SimError, SimErrorKind, SimResult};

/// A link: a message of `b` bytes holds a port for `b / bandwidth` and arrives `latency`
/// after it left.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// One-way latency of a small message, seconds.
    pub latency_s: f64,
    /// Bandwidth of one port in one direction, GB/s (10⁹ bytes a second).
    pub bandwidth_gb_s: f64,
    /// Ports (network: rails per host, ranks spread over them; otherwise 1 per endpoint).
    #[serde(default = "one")]
    pub ports: usize,
    /// The bytes are copied by the communication threads (shared memory, the in-process
    /// network): a host value's `bytes / bandwidth` is their work on the hosts' cores, half
    /// on each side, rather than a port's time.
    #[serde(default)]
    pub cpu_copy: bool,
    /// Where the figures come from (measured here, docs/benchmarks.md, or a vendor's figure).
    #[serde(default)]
    pub source: String,
}

fn one() -> usize {
    1
}

/// How a GPU node's output reaches a GPU of another rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuTransfer {
    /// Through pinned host memory (what `boundpool-ranks` does without NCCL): a device-to-host
    /// copy, the host message, a host-to-device copy, pipelined in chunks.
    Staged,
    /// GPU to GPU (NVLink in a host, GPUDirect RDMA between hosts: NCCL's path).
    Direct,
}

/// A group of workers on every rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupDesc {
    /// Its name (a workload places nodes on groups by index; the trace names tracks by it).
    pub name: String,
    /// Workers in the group.
    pub workers: usize,
    /// Workers of the rank's GPU (each with its own streams) rather than host workers.
    #[serde(default)]
    pub gpu: bool,
    /// The workers' normal-level streams have a high CUDA priority
    /// (`GpuPoolBuilder::stream_priority`).
    #[serde(default)]
    pub high_streams: bool,
}

/// A GPU model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuDesc {
    /// Its name.
    pub name: String,
    /// Peak FP64 rate (tensor cores), TFLOP/s: for efficiency figures only.
    pub fp64_tflops: f64,
    /// Memory, GiB: a workload that does not fit is reported, not refused.
    pub memory_gib: f64,
    /// From a launch on the host to the kernel's earliest start, seconds.
    pub launch_latency_s: f64,
    /// From a kernel's end to a worker polling its completion word seeing it, seconds.
    pub completion_s: f64,
    /// A GPU node with one GPU successor of its level hands its stream over
    /// (`GpuPoolBuilder::stream_handoff`).
    #[serde(default)]
    pub stream_handoff: bool,
    /// Kernels on high-priority streams take their share of the GPU first. Off by default
    /// and in the presets: a priority orders which waiting blocks start, never what already
    /// runs, and the recorded H100 runs show high-priority kernels slowed as much as the
    /// others (the crate's README, "A GPU's concurrency").
    #[serde(default)]
    pub stream_priorities: bool,
    /// Where the figures come from.
    #[serde(default)]
    pub source: String,
}

/// When a deferred completion (a GPU node's device work, a receive's arrival, a send's end)
/// releases its node's successors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Completion {
    /// When the worker that registered it runs dry and polls (`complete_when`, today's).
    WhenDry,
    /// At once, by whichever worker of the group takes it from the injector (the proposed
    /// `complete_later`, ranks/README.md).
    AtOnce,
}

/// The scheduler's own costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedDesc {
    /// Per node taken and released (the scheduler's ns per node on an empty node).
    pub node_s: f64,
    /// Extra for a node stolen from another worker's deque.
    pub steal_s: f64,
    /// From a push to a parked worker running (a futex wake-up).
    pub wake_s: f64,
    /// How long a worker that ran dry watches the queues before it parks (`SPIN_BEFORE_PARK`).
    pub spin_s: f64,
    /// A worker with deferred completions polls between yields this long before it parks
    /// (`DEFERRED_SPIN`), then parks this long at a time.
    pub deferred_spin_s: f64,
    /// Its timed park with deferred completions pending.
    pub deferred_park_s: f64,
    /// One poll of one pending deferred completion.
    pub poll_s: f64,
    /// When deferred completions release their successors.
    pub completion: Completion,
}

/// The communication thread's costs, per rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommDesc {
    /// A send or receive node's body on its worker.
    pub node_s: f64,
    /// The communication thread's work per message sent (the command, `MPI_Isend`).
    pub send_s: f64,
    /// Its work per message received (probe, receive, the cell filled).
    pub recv_s: f64,
    /// An arrival waits on average this long to be seen when the thread has been idle longer
    /// than `active_s` (it parks 100 µs at a time and cannot be woken by a message).
    pub idle_poll_s: f64,
    /// How long after its last work the thread still yields rather than parks.
    pub active_s: f64,
}

/// The links between ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinksDesc {
    /// Host values between ranks of one host (MPI shared memory, or the in-process network).
    pub shm: Link,
    /// Between hosts (InfiniBand, Ethernet); `ports` rails per host.
    pub network: Link,
    /// GPU to GPU in a host, per GPU and direction (NVLink).
    #[serde(default)]
    pub nvlink: Option<Link>,
    /// Host to device and back, per GPU and direction (PCIe).
    #[serde(default)]
    pub pcie: Option<Link>,
    /// How GPU values cross ranks.
    pub gpu_transfer: GpuTransfer,
    /// Staged transfers move in chunks of this size, so their stages overlap.
    pub chunk_bytes: u64,
}

/// The machine: `hosts` hosts of `cores_per_host` cores and `gpus_per_host` GPUs, each running
/// `ranks_per_host` ranks; each rank has the worker `groups`, its communication thread, and
/// the GPU `rank mod gpus_per_host` of its host. Rank `r` lives on host `r / ranks_per_host`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Its name.
    pub name: String,
    /// Hosts.
    pub hosts: usize,
    /// Ranks on each host.
    pub ranks_per_host: usize,
    /// Cores of each host, shared by its ranks' workers (processor sharing past that).
    pub cores_per_host: usize,

    /// GPUs of each host.
    #[serde(default)]
    pub gpus_per_host: usize,
    /// Worker groups of every rank, in `GroupId` order.
    pub groups: Vec<GroupDesc>,
    /// The GPU, where there are any.
    #[serde(default)]
    pub gpu: Option<GpuDesc>,
    /// The scheduler's costs.
    pub sched: SchedDesc,
    /// The communication thread's costs.
    pub comm: CommDesc,
    /// The links.
    pub links: LinksDesc,
}

impl Machine {
    /// Ranks in all.
    pub fn ranks(&self) -> usize {
        self.hosts * self.ranks_per_host
    }

    /// Workers of one rank.
    pub fn workers_per_rank(&self) -> usize {
        self.groups.iter().map(|g| g.workers).sum()
    }

    /// The host of rank `r`.
    pub fn host_of(&self, r: usize) -> usize {
        r / self.ranks_per_host
    }

    /// The GPU of rank `r` (global index `host × gpus_per_host + local`), if the host has any.
    pub fn gpu_of(&self, r: usize) -> Option<usize> {
        (self.gpus_per_host > 0).then(|| {
            self.host_of(r) * self.gpus_per_host + (r % self.ranks_per_host) % self.gpus_per_host
        })
    }

    /// The network rail of rank `r` on its host.
    pub fn rail_of(&self, r: usize) -> usize {
        let rails = self.links.network.ports.max(1);
        (r % self.ranks_per_host) * rails / self.ranks_per_host
    }

    /// Checks the description: counts positive, links with bandwidth, GPU groups only where
    /// there is a GPU.
    pub fn check(&self) -> SimResult<()> {
        let bad = |m: String| Err(SimError::new(SimErrorKind::InvalidMachine, m));
        if self.hosts == 0 || self.ranks_per_host == 0 || self.cores_per_host == 0 {
            return bad(format!(
                "machine '{}': hosts ({}), ranks per host ({}) and cores per host ({}) must be positive",
                self.name, self.hosts, self.ranks_per_host, self.cores_per_host
            ));
        }
        if self.groups.is_empty() || self.groups.iter().any(|g| g.workers == 0) {
            return bad(format!(
                "machine '{}': every rank needs at least one group, each with a worker",
                self.name
            ));
        }
        if let Some(g) = self.groups.iter().find(|g| g.gpu) {
            if self.gpus_per_host == 0 || self.gpu.is_none() {
                return bad(format!(
                    "machine '{}': group '{}' is a GPU group, but the hosts have no GPU \
                     (gpus_per_host and gpu)",
                    self.name, g.name
                ));
            }
        }
        let links = [
            ("shm", Some(&self.links.shm)),
            ("network", Some(&self.links.network)),
            ("nvlink", self.links.nvlink.as_ref()),
            ("pcie", self.links.pcie.as_ref()),
        ];
        for (name, link) in links {
            if let Some(l) = link {
                if !(l.bandwidth_gb_s > 0.0 && l.latency_s >= 0.0 && l.ports > 0) {
                    return bad(format!(
                        "machine '{}': link '{name}' needs a positive bandwidth and port count \
                         and a latency >= 0 (got {} GB/s, {} s, {} ports)",
                        self.name, l.bandwidth_gb_s, l.latency_s, l.ports
                    ));
                }
            }
        }
        if self.gpus_per_host > 0
            && self.links.gpu_transfer == GpuTransfer::Staged
            && self.links.pcie.is_none()
        {
            return bad(format!(
                "machine '{}': staged GPU transfers need a 'pcie' link",
                self.name
            ));
        }
        Ok(())
    }

    /// Reads a machine description (JSON) and checks it.
    pub fn load(path: &Path) -> SimResult<Self> {
        let m: Machine = crate::json_file::read(path, "a machine description")?;
        m.check()?;
        Ok(m)
    }

    /// The description as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a machine serializes")
    }
}

/// The network between hosts in the presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// 4 × 200 Gb/s InfiniBand (HDR / NDR200) rails per host.
    InfiniBand4x200,
    /// One 25 GB/s (200 GbE) Ethernet port per host.
    Ethernet25,
}

/// The scheduler's costs measured on this project's machines (docs/benchmarks.md).
fn sched_measured() -> SchedDesc {
    SchedDesc {
        node_s: 0.3e-6,
        steal_s: 1.0e-6,
        wake_s: 20e-6,
        spin_s: 20e-6,
        deferred_spin_s: 2e-3,
        deferred_park_s: 50e-6,
        poll_s: 0.05e-6,
        completion: Completion::WhenDry,
    }
}

impl Machine {
    /// The 2-core development machine with `ranks` ranks of `workers` host workers each, the
    /// ranks as threads of one process over the in-process network (`LocalNetwork`).
    /// The link is what docs/benchmarks.md measured for ranks here; calibrate it for a run
    /// (`boundpool sim --check` does).
    pub fn dev_host(ranks: usize, workers: usize) -> Self {
        let measured =
            "measured: docs/benchmarks.md, Ranks over MPI, 2026-12-06 (2-core machine): \
                        8-byte edge 64-69 us, 64 MiB value 1.5 GB/s";
        Machine {
            name: format!("2-core development machine, {ranks} rank(s) x {workers} worker(s)"),
            hosts: 1,
            ranks_per_host: ranks,
            cores_per_host: 2,
            gpus_per_host: 0,
            groups: vec![GroupDesc {
                name: "host".into(),
                workers,
                gpu: false,
                high_streams: false,
            }],
            gpu: None,
            sched: sched_measured(),
            comm: CommDesc {
                node_s: 1e-6,
                send_s: 2e-6,
                recv_s: 2e-6,
                idle_poll_s: 50e-6,
                active_s: 2e-3,
            },
            links: LinksDesc {
                shm: Link {
                    latency_s: 60e-6,
                    bandwidth_gb_s: 1.5,
                    ports: 1,
                    cpu_copy: true,
                    source: measured.into(),
                },
                network: Link {
                    latency_s: 60e-6,
                    bandwidth_gb_s: 1.5,
                    ports: 1,
                    cpu_copy: false,
                    source: "unused: one host".into(),
                },
                nvlink: None,
                pcie: None,
                gpu_transfer: GpuTransfer::Staged,
                chunk_bytes: 4 << 20,
            },
        }
    }

    /// `gpus` H100 SXM GPUs, 8 a host (fewer on one host when `gpus` < 8), one rank per GPU
    /// with 8 workers (4 panel workers on high-priority streams, 4 update workers: the tiled
    /// Cholesky's configuration), NVLink in a host, `network` between hosts, GPU values
    /// moved `transfer`.
    pub fn h100_cluster(gpus: usize, network: Network, transfer: GpuTransfer) -> Self {
        let per_host = gpus.clamp(1, 8);
        let hosts = gpus.div_ceil(per_host).max(1);
        let net = match network {
            Network::InfiniBand4x200 => Link {
                latency_s: 2e-6,
                bandwidth_gb_s: 25.0,
                ports: 4,
                cpu_copy: false,
                source: "vendor: 200 Gb/s a rail (NVIDIA ConnectX-7 NDR200/HDR, \
                         docs.nvidia.com/networking ConnectX7VPI); latency assumed (MPI over HDR)"
                    .into(),
            },
            Network::Ethernet25 => Link {
                latency_s: 10e-6,
                bandwidth_gb_s: 25.0,
                ports: 1,
                cpu_copy: false,
                source: "vendor: one 200 GbE port a host; latency assumed (MPI over TCP/RoCE)"
                    .into(),
            },
        };
        Machine {
            name: format!(
                "{gpus} x H100 SXM, {per_host} a host, {}, GPU values {}",
                match network {
                    Network::InfiniBand4x200 => "4 x 200 Gb/s InfiniBand",
                    Network::Ethernet25 => "25 GB/s Ethernet",
                },
                match transfer {
                    GpuTransfer::Staged => "staged through the host",
                    GpuTransfer::Direct => "GPU to GPU",
                }
            ),
            hosts,
            ranks_per_host: per_host,
            cores_per_host: 112,
            gpus_per_host: per_host,
            groups: vec![
                GroupDesc {
                    name: "panel".into(),
                    workers: 4,
                    gpu: true,
                    high_streams: true,
                },
                GroupDesc {
                    name: "update".into(),
                    workers: 4,
                    gpu: true,
                    high_streams: false,
                },
            ],
            gpu: Some(GpuDesc {
                name: "H100 SXM 80GB".into(),
                fp64_tflops: 67.0,
                memory_gib: 80.0,
                launch_latency_s: 4e-6,
                completion_s: 2e-6,
                stream_handoff: false,
                stream_priorities: false,
                source: "vendor: FP64 tensor 67 TFLOP/s, 80 GB HBM3, NVLink 900 GB/s, PCIe Gen5 \
                         128 GB/s (both directions; NVIDIA H100 datasheet); launch from DESIGN.md \
                         (4.2 us a raw launch, one thread)"
                    .into(),
            }),
            sched: sched_measured(),
            comm: CommDesc {
                node_s: 1e-6,
                send_s: 2e-6,
                recv_s: 2e-6,
                idle_poll_s: 50e-6,
                active_s: 2e-3,
            },
            links: LinksDesc {
                shm: Link {
                    latency_s: 1e-6,
                    bandwidth_gb_s: 10.0,
                    ports: 1,
                    cpu_copy: true,
                    source: "assumed: MPI shared memory on a server host".into(),
                },
                network: net,
                nvlink: Some(Link {
                    latency_s: 3e-6,
                    bandwidth_gb_s: 450.0,
                    ports: 1,
                    cpu_copy: false,
                    source: "vendor: NVLink 4, 900 GB/s a GPU both directions (NVIDIA H100 \
                             datasheet); latency assumed"
                        .into(),
                }),
                pcie: Some(Link {
                    latency_s: 2e-6,
                    bandwidth_gb_s: 64.0,
                    ports: 1,
                    cpu_copy: false,
                    source: "vendor: PCIe Gen5 x16, 128 GB/s both directions (NVIDIA H100 \
                             datasheet); latency assumed"
                        .into(),
                }),
                gpu_transfer: transfer,
                chunk_bytes: 4 << 20,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_check_and_round_trip() {
        for m in [
            Machine::dev_host(4, 1),
            Machine::h100_cluster(1, Network::InfiniBand4x200, GpuTransfer::Staged),
            Machine::h100_cluster(64, Network::Ethernet25, GpuTransfer::Direct),
        ] {
            m.check().unwrap();
            let back: Machine = serde_json::from_str(&m.to_json()).unwrap();
            assert_eq!(back, m);
        }
        let m = Machine::h100_cluster(64, Network::InfiniBand4x200, GpuTransfer::Direct);
        assert_eq!((m.hosts, m.ranks(), m.workers_per_rank()), (8, 64, 8));
        assert_eq!((m.host_of(9), m.gpu_of(9), m.rail_of(9)), (1, Some(9), 0));
        assert_eq!(m.rail_of(7), 3);
    }

    #[test]
    fn inconsistent_descriptions_are_refused() {
        let mut m = Machine::dev_host(2, 1);
        m.groups[0].gpu = true;
        let e = m.check().unwrap_err();
        assert_eq!(e.kind(), SimErrorKind::InvalidMachine);
        assert!(e.to_string().contains("group 'host' is a GPU group"), "{e}");
        let mut m = Machine::dev_host(2, 1);
        m.links.shm.bandwidth_gb_s = 0.0;
        assert!(m.check().unwrap_err().to_string().contains("link 'shm'"));
    }
}

//! What a GPU node calls: [`GpuCtx::nccl_init`] (the device's communicator, made on this bound
//! worker) and the NCCL operations on device buffers of the node's device.
//!
//! Each operation runs on the communicator's stream, after an event wait for the node's
//! stream (where the node's predecessors' work is ordered), and the node's work then counts as
//! being on that stream (`GpuCtx::moved_to`): successors wait on an event recorded there right
//! after it, never on the worker's stream. An NCCL kernel waits on the GPU for its peers; on a
//! worker's stream it would hold back every later node of that worker, some of which a peer may
//! need before it can issue its side (a deadlock the graph does not show). On a stream of its
//! own it holds back only later NCCL operations, which every rank issues in one order.

use cudarc::nccl::{result as nr, sys as ns, NcclType, ReduceOp};

use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::device::NcclInfo;
use crate::driver;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::nccl::comm::{nccl_error, DeviceComm, NcclId};
use crate::node::GpuCtx;

/// Element types NCCL moves and reduces: cudarc's `NcclType`s (the integers, `f32`, `f64`,
/// `half::f16`, `half::bf16`) that are plain device data.
pub trait NcclElement: DeviceCopy + NcclType {}

impl<T: DeviceCopy + NcclType> NcclElement for T {}

fn reduce_op(op: &ReduceOp) -> ns::ncclRedOp_t {
    match op {
        ReduceOp::Sum => ns::ncclRedOp_t::ncclSum,
        ReduceOp::Prod => ns::ncclRedOp_t::ncclProd,
        ReduceOp::Max => ns::ncclRedOp_t::ncclMax,
        ReduceOp::Min => ns::ncclRedOp_t::ncclMin,
        ReduceOp::Avg => ns::ncclRedOp_t::ncclAvg,
    }
}

impl GpuCtx<'_, '_> {
    /// Makes this device's NCCL communicator: joins the communicator of `id` as `rank` of
    /// `world` (`ncclCommInitRank`, which blocks this worker until every rank has joined),
    /// with a stream of its own for its operations. Once per device; the device's last
    /// worker aborts it at the pool's shutdown. An error naming the files tried when libnccl
    /// is missing.
    pub fn nccl_init(&self, id: &NcclId, rank: usize, world: usize) -> GpuResult<()> {
        if let Some(c) = self.capture {
            return Err(c.refuse(self, "making an NCCL communicator"));
        }
        let mut slot = self.b.device.nccl.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: device {} already has an NCCL communicator",
                    self.what(),
                    self.b.device.ordinal()
                ),
            ));
        }
        let comm = DeviceComm::init(
            &self.b.cuda,
            |s| self.b.device.register_stream(s),
            id,
            (rank, world),
            &self.what(),
        )?;
        *slot = Some(comm);
        Ok(())
    }

    /// Connects this device's communicator to its peers for every kind of operation: a tiny
    /// all-reduce, broadcast, all-gather and reduce-scatter, and a byte sent to and received
    /// from every other rank (one NCCL group). NCCL otherwise connects lazily, at the first
    /// operation that needs a connection, with a handshake that blocks the calling worker
    /// until the peer reaches the same operation; every rank calls this together right after
    /// [`nccl_init`](Self::nccl_init), so that later operations only enqueue.
    pub fn nccl_connect(&self) -> GpuResult<()> {
        let info = self.nccl_info()?;
        let (me, world) = (info.rank, info.world);
        let one = self.alloc_zeros::<f32>(1)?;
        let blocks = self.alloc_zeros::<f32>(world)?;
        let mut out = self.alloc::<f32>(1)?;
        let mut all = self.alloc::<f32>(world)?;
        self.nccl_all_reduce(&one, &mut out, &ReduceOp::Sum)?;
        self.nccl_broadcast(Some(&one), &mut out, 0)?;
        self.nccl_all_gather(&one, &mut all)?;
        self.nccl_reduce_scatter(&blocks, &mut out, &ReduceOp::Sum)?;
        if world > 1 {
            let send = self.alloc_zeros::<u8>(world)?;
            let recv = self.alloc::<u8>(world)?;
            let (s, r) = (send.device_ptr(), recv.device_ptr());
            self.nccl_op("ncclSend/ncclRecv", |comm, stream| {
                nr::group_start()?;
                for peer in (0..world).filter(|&p| p != me) {
                    let at = peer as u64;
                    let dt = ns::ncclDataType_t::ncclUint8;
                    // SAFETY: byte `peer` of two live allocations of `world` bytes of this
                    // device, kept until the node's work is done (the node's own buffers,
                    // freed after the work enqueued).
                    unsafe {
                        nr::send((s + at) as _, 1, dt, peer as i32, comm, stream)?;
                        nr::recv((r + at) as _, 1, dt, peer as i32, comm, stream)?;
                    }
                }
                nr::group_end()
            })?;
        }
        Ok(())
    }

    /// This device's place in its NCCL communicator, if it has one.
    pub fn nccl(&self) -> Option<NcclInfo> {
        self.b.device.nccl_info()
    }

    /// `ncclAllReduce` of `send` into `recv` (same length) over the device's communicator.
    pub fn nccl_all_reduce<T: NcclElement>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: &ReduceOp,
    ) -> GpuResult<()> {
        self.nccl_check(&[send, recv], |_| send.len() == recv.len())?;
        let (s, r, n) = (send.device_ptr(), recv.device_ptr(), send.len());
        self.nccl_op("ncclAllReduce", |comm, stream| {
            // SAFETY: both are live allocations of `n` elements of this device, kept by the
            // node's inputs and output until its work is done.
            unsafe {
                nr::all_reduce(
                    s as _,
                    r as _,
                    n,
                    T::as_nccl_type(),
                    reduce_op(op),
                    comm,
                    stream,
                )
            }
        })
    }

    /// `ncclBroadcast` of the root's `send` into every rank's `recv` (`send`: `Some` on the
    /// root, of `recv`'s length; ignored elsewhere).
    pub fn nccl_broadcast<T: NcclElement>(
        &self,
        send: Option<&DeviceBuffer<T>>,
        recv: &mut DeviceBuffer<T>,
        root: usize,
    ) -> GpuResult<()> {
        let me = self.nccl_info()?;
        if me.rank == root && send.is_none() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: ncclBroadcast: the root gives a buffer to send",
                    self.what()
                ),
            ));
        }
        let mut bufs = vec![&*recv];
        bufs.extend(send);
        self.nccl_check(&bufs, |_| {
            root < me.world && send.is_none_or(|s| s.len() == recv.len())
        })?;
        let s = send.map_or(0, |b| b.device_ptr());
        let (r, n, root) = (recv.device_ptr(), recv.len(), root as i32);
        self.nccl_op("ncclBroadcast", |comm, stream| {
            // SAFETY: live allocations of `n` elements of this device (the send buffer only
            // read on the root, where it is given), kept until the node's work is done.
            unsafe { nr::broadcast(s as _, r as _, n, T::as_nccl_type(), root, comm, stream) }
        })
    }

    /// `ncclReduceScatter`: `send` holds `world` blocks of `recv`'s length; this rank's
    /// reduced block lands in `recv`.
    pub fn nccl_reduce_scatter<T: NcclElement>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: &ReduceOp,
    ) -> GpuResult<()> {
        self.nccl_check(&[send, recv], |w| send.len() == recv.len() * w)?;
        let (s, r, n) = (send.device_ptr(), recv.device_ptr(), recv.len());
        self.nccl_op("ncclReduceScatter", |comm, stream| {
            // SAFETY: `send` holds `world * n` and `recv` `n` elements of this device, both
            // kept until the node's work is done.
            unsafe {
                nr::reduce_scatter(
                    s as _,
                    r as _,
                    n,
                    T::as_nccl_type(),
                    reduce_op(op),
                    comm,
                    stream,
                )
            }
        })
    }

    /// `ncclAllGather`: every rank's `send` lands, in rank order, in `recv` (`world` times
    /// `send`'s length).
    pub fn nccl_all_gather<T: NcclElement>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
    ) -> GpuResult<()> {
        self.nccl_check(&[send, recv], |w| recv.len() == send.len() * w)?;
        let (s, r, n) = (send.device_ptr(), recv.device_ptr(), send.len());
        self.nccl_op("ncclAllGather", |comm, stream| {
            // SAFETY: `send` holds `n` and `recv` `world * n` elements of this device, both
            // kept until the node's work is done.
            unsafe { nr::all_gather(s as _, r as _, n, T::as_nccl_type(), comm, stream) }
        })
    }

    /// `ncclSend` of `send` to rank `peer` (which posts an `nccl_recv` of the same length).
    pub fn nccl_send<T: NcclElement>(&self, send: &DeviceBuffer<T>, peer: usize) -> GpuResult<()> {
        self.nccl_check(&[send], |w| peer < w)?;
        let (s, n, peer) = (send.device_ptr(), send.len(), peer as i32);
        self.nccl_op("ncclSend", |comm, stream| {
            // SAFETY: a live allocation of `n` elements of this device, kept until the node's
            // work is done.
            unsafe { nr::send(s as _, n, T::as_nccl_type(), peer, comm, stream) }
        })
    }

    /// `ncclRecv` into `recv` from rank `peer` (which posts an `nccl_send` of `recv`'s length).
    pub fn nccl_recv<T: NcclElement>(
        &self,
        recv: &mut DeviceBuffer<T>,
        peer: usize,
    ) -> GpuResult<()> {
        self.nccl_check(&[recv], |w| peer < w)?;
        let (r, n, peer) = (recv.device_ptr(), recv.len(), peer as i32);
        self.nccl_op("ncclRecv", |comm, stream| {
            // SAFETY: a live allocation of `n` elements of this device, kept by the node's
            // output until its work is done.
            unsafe { nr::recv(r as _, n, T::as_nccl_type(), peer, comm, stream) }
        })
    }

    /// [`nccl_send`](Self::nccl_send) of any plain device data, as its bytes (`ncclUint8`):
    /// the receiver gives a buffer of the same number of bytes.
    pub fn nccl_send_bytes<T: DeviceCopy>(
        &self,
        send: &DeviceBuffer<T>,
        peer: usize,
    ) -> GpuResult<()> {
        self.nccl_check(&[send], |w| peer < w)?;
        let (s, n, peer) = (send.device_ptr(), send.bytes(), peer as i32);
        self.nccl_op("ncclSend", |comm, stream| {
            // SAFETY: a live allocation of `n` bytes of this device, kept until the node's
            // work is done.
            unsafe { nr::send(s as _, n, ns::ncclDataType_t::ncclUint8, peer, comm, stream) }
        })
    }

    /// [`nccl_recv`](Self::nccl_recv) of any plain device data, as its bytes (`ncclUint8`).
    pub fn nccl_recv_bytes<T: DeviceCopy>(
        &self,
        recv: &mut DeviceBuffer<T>,
        peer: usize,
    ) -> GpuResult<()> {
        self.nccl_check(&[recv], |w| peer < w)?;
        let (r, n, peer) = (recv.device_ptr(), recv.bytes(), peer as i32);
        self.nccl_op("ncclRecv", |comm, stream| {
            // SAFETY: a live allocation of `n` bytes of this device, kept by the node's output
            // until its work is done.
            unsafe { nr::recv(r as _, n, ns::ncclDataType_t::ncclUint8, peer, comm, stream) }
        })
    }

    fn nccl_info(&self) -> GpuResult<NcclInfo> {
        self.nccl().ok_or_else(|| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: device {} has no NCCL communicator (GpuCtx::nccl_init)",
                    self.what(),
                    self.b.device.ordinal()
                ),
            )
        })
    }

    /// Every buffer is of this node's device, and `sizes(world)` holds.
    fn nccl_check<T: DeviceCopy>(
        &self,
        bufs: &[&DeviceBuffer<T>],
        sizes: impl FnOnce(usize) -> bool,
    ) -> GpuResult<()> {
        let info = self.nccl_info()?;
        if let Some(b) = bufs
            .iter()
            .find(|b| !std::sync::Arc::ptr_eq(&b.device, &self.b.device))
        {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: an NCCL operation on a buffer of device {} (on_device makes it this \
                     node's)",
                    self.what(),
                    b.device.ordinal()
                ),
            ));
        }
        if !sizes(info.world) {
            let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: NCCL buffers of {lens:?} elements (or a rank) that do not fit a \
                     communicator of {} ranks",
                    self.what(),
                    info.world
                ),
            ));
        }
        Ok(())
    }

    /// Runs `call` on the communicator's stream after the node's stream, under the device's
    /// lock; the node's work then counts as being on that stream.
    fn nccl_op(
        &self,
        name: &'static str,
        call: impl FnOnce(ns::ncclComm_t, ns::cudaStream_t) -> Result<nr::NcclStatus, nr::NcclError>,
    ) -> GpuResult<()> {
        if let Some(c) = self.capture {
            return Err(c.refuse(self, "an NCCL operation (it belongs to an eager node)"));
        }
        let slot = self.b.device.nccl.lock().unwrap_or_else(|e| e.into_inner());
        let Some(comm) = slot.as_ref() else {
            return Err(self.nccl_info().unwrap_err());
        };
        // The communicator's stream follows this node's (its inputs are ordered there).
        let e = self
            .b
            .record_event(self.stream)
            .map_err(|(call, e)| self.fail_call(call, e))?;
        let waited = driver::stream_wait_event(self.b.ctx, comm.stream, &e);
        self.b.put_event(e);
        waited.map_err(|e| self.fail_call("cuStreamWaitEvent", e))?;
        call(comm.raw(), comm.stream.raw_ptr() as ns::cudaStream_t)
            .map_err(|e| nccl_error(name, e, &self.what()))?;
        self.moved_to.set(Some(comm.stream));
        Ok(())
    }
}

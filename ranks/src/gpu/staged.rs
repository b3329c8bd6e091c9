//! Device values staged through page-locked host memory (the device machine's MPI is not
//! CUDA-aware).
//!
//! * **Send**: a GPU node on the producer's device copies the buffer into page-locked staging
//!   memory chunk by chunk, each copy followed by a write of the memory's [`HostSignal`] (the
//!   count of chunks done), and hands the communication thread a staged payload that reads the
//!   signal: chunk `i` is sent once the signal passed it, while the device copies chunk `i + 1`.
//!   A host node after it completes when the transport is done (the send cell), and a host node
//!   after that gives the memory back to the pool.
//! * **Receive**: the value lands in page-locked memory of the pool (taken by the communication
//!   thread without a driver call: a buffer whose last device use its signal says is done), and
//!   a GPU node on the consumer's device uploads it, then gives the memory back at once, guarded
//!   by a signal written after the upload's copy. The first arrival of a size the pool has no
//!   buffer for lands in ordinary memory (uploaded through the driver's staging) and leaves a
//!   page-locked buffer of its size in the pool for the next.
//!
//! The pool belongs to the device value's node (its maker, owned by the graph): every run, slot,
//! send and receive of that node shares it, so a graph's steady state allocates nothing.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use boundpool_gpu::{DeviceBuffer, DeviceCopy, GpuCtx, GpuWorker, HostSignal, PinnedBuffer};
use boundpool_scheduler::backend::NodeCtxExt;
use boundpool_scheduler::{BoxError, GraphBuilder, NodeCtx};

use crate::comm::{Command, Payload, StagedPayload};
use crate::gpu::nodes::{add_gpu_node, RecvWhat, SendWhat};
use crate::graph::{add_recv as add_recv_node, Mapped, Received, RecvNodes, SendNodes, SlotEnv};
use crate::value::{AnyValue, LandFn, Landing};

/// The most bytes of a staged value in one message, whatever its chunks: MPI moves one long
/// message between two processes' non-blocking calls far slower than several shorter ones in
/// flight at once (the device machine's Open MPI and this machine's alike).
pub(crate) const MESSAGE_BYTES: usize = 4 << 20;

/// The chunks of a value of `len` elements of `size` bytes, in pieces of about `chunk` bytes
/// (a whole number of elements, at least one): element ranges, in order. One (empty) range
/// for an empty value.
pub(crate) fn chunks(len: usize, size: usize, chunk: usize) -> Vec<Range<usize>> {
    let per = (chunk / size.max(1)).max(1);
    if len == 0 {
        return std::iter::once(0..0).collect();
    }
    (0..len.div_ceil(per))
        .map(|i| i * per..((i + 1) * per).min(len))
        .collect()
}

/// Page-locked memory of the pool, and the signal its device writes after each use of it.
pub(crate) struct Staging<E: DeviceCopy> {
    buf: PinnedBuffer<E>,
    signal: Arc<HostSignal>,
    /// The value `signal` holds once the device's last use of `buf` is done.
    free_at: u32,
}

impl<E: DeviceCopy> Staging<E> {
    /// New memory for `n` elements (at least one), on the node's device.
    fn new(gpu: &GpuCtx<'_, '_>, n: usize) -> Result<Self, BoxError> {
        Ok(Staging {
            buf: gpu.alloc_pinned::<E>(n.max(1))?,
            signal: Arc::new(gpu.host_signal()?),
            free_at: 0,
        })
    }

    /// Whether no device work on it is in flight (read without a driver call).
    fn idle(&self) -> bool {
        self.signal.value() == self.free_at
    }
}

/// The page-locked buffers a device value is staged in and lands in, reused across runs: free
/// ones, each perhaps still in a device copy that its signal will say is done. Its node's maker
/// owns it (the graph: dropped on the user's thread, its buffers freed by a bound worker); the
/// landing, which the communication thread keeps until it ends, holds it weakly.
pub(crate) struct StagingPool<E: DeviceCopy> {
    free: Mutex<Vec<Staging<E>>>,
}

impl<E: DeviceCopy> Default for StagingPool<E> {
    fn default() -> Self {
        StagingPool {
            free: Mutex::new(Vec::new()),
        }
    }
}

impl<E: DeviceCopy> StagingPool<E> {
    /// An idle buffer of at least `n` elements (the smallest such).
    fn take(&self, n: usize) -> Option<Staging<E>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, s)| s.buf.len() >= n && s.idle())
            .min_by_key(|(_, s)| s.buf.len())
            .map(|(i, _)| i)?;
        Some(free.swap_remove(best))
    }

    fn put(&self, s: Staging<E>) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

/// The staging memory a slot's send holds from its copies until the transport is done.
struct Lease<E: DeviceCopy> {
    held: Option<Staging<E>>,
    /// Memory of a send that never reported done (its run failed): kept, never reused, until
    /// the graph goes (the transport may still read it).
    retired: Vec<Staging<E>>,
}

/// Adds the staged send of `what.from`'s buffer to rank `what.to`: a GPU node that stages it,
/// a host node that completes once it is sent, and one that gives the memory back.
pub(crate) fn add_send<E: DeviceCopy>(
    gb: &mut GraphBuilder<GpuWorker>,
    env: &Arc<SlotEnv>,
    what: SendWhat<'_, E>,
    pool: &Arc<StagingPool<E>>,
    chunk: usize,
) -> SendNodes {
    let lease: Arc<Mutex<Lease<E>>> = Arc::new(Mutex::new(Lease {
        held: None,
        retired: Vec::new(),
    }));
    let (from, k) = (what.from, what.k);
    let senv = env.clone();
    let (stage_pool, stage_lease) = (pool.clone(), lease.clone());
    let stager = add_gpu_node(
        gb,
        env,
        what.device,
        format!("stage '{}' for rank {}", what.name, what.to),
        what.producer,
        move |ctx| {
            let gpu = ctx.gpu();
            let buf = gpu.input(from)?;
            let payload = stage_out(gpu, buf, &stage_pool, &stage_lease, chunk)?;
            senv.comm.send(Command::Send {
                run: senv.current(),
                k,
                payload: Payload::Staged(payload),
            });
            Ok(())
        },
    );
    let denv = env.clone();
    let done = gb.node(
        format!("send '{}' to rank {}", what.name, what.to),
        move |ctx: &NodeCtx<'_, GpuWorker>| {
            // Completed by the comm thread once the transport is done with the staged value.
            denv.current().sends[k as usize].complete_on(ctx.complete_later());
            Ok(())
        },
    );
    gb.edge(stager.id(), done.id());
    // The transport is done with the memory (or never started): back to the pool, where its
    // signal still guards the device's copies.
    let release_pool = pool.clone();
    let release = gb.node(
        format!("release staging of '{}' for rank {}", what.name, what.to),
        move |_: &NodeCtx<'_, GpuWorker>| {
            let mut l = lease.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = l.held.take() {
                release_pool.put(s);
            }
            Ok(())
        },
    );
    gb.edge(done.id(), release.id());
    SendNodes {
        inputs: vec![stager.id()],
        nccl: None,
    }
}

/// Enqueues the chunks' copies of `buf` into staging memory from `pool` (new memory when it
/// has none idle and large enough), each followed by its signal, and returns the payload that
/// sends them as they are done; `lease` holds the memory until the send is done.
fn stage_out<E: DeviceCopy>(
    gpu: &GpuCtx<'_, '_>,
    buf: &DeviceBuffer<E>,
    pool: &StagingPool<E>,
    lease: &Mutex<Lease<E>>,
    chunk: usize,
) -> Result<StagedPayload, BoxError> {
    let mut s = match pool.take(buf.len()) {
        Some(s) => s,
        None => Staging::new(gpu, buf.len())?,
    };
    let size = std::mem::size_of::<E>();
    let pieces = chunks(buf.len(), size, chunk);
    let base = s.free_at;
    for (i, r) in pieces.iter().enumerate() {
        if !r.is_empty() {
            gpu.copy_to_pinned_at(buf, r.clone(), &s.buf, r.start)?;
        }
        gpu.signal(&s.signal, base.wrapping_add(i as u32 + 1))?;
    }
    s.free_at = base.wrapping_add(pieces.len() as u32);
    let len = buf.len() * size;
    let chunk_bytes = pieces[0].len().max(1) * size;
    let (signal, ptr) = (s.signal.clone(), s.buf.host_ptr() as *const u8);
    let mut l = lease.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(stale) = l.held.replace(s) {
        l.retired.push(stale);
    }
    Ok(StagedPayload {
        ptr,
        len,
        piece: chunk_bytes.min(MESSAGE_BYTES),
        ready: Box::new(move || {
            let done = signal.value().wrapping_sub(base) as usize;
            done.min(pieces.len()).saturating_mul(chunk_bytes).min(len)
        }),
    })
}

/// Where an arrived device value's bytes are on the host.
enum Host<E: DeviceCopy> {
    /// Page-locked memory of the pool (its first `n` elements).
    Pinned(Staging<E>),
    /// Ordinary memory (the pool had no idle buffer large enough).
    Pageable(Vec<E>),
}

/// A device value that arrived on this rank, waiting for its upload, which takes its bytes
/// (and gives page-locked memory back to the pool). Dropped before that (its run failed), it
/// gives the memory back itself.
pub(crate) struct Arrived<E: DeviceCopy> {
    host: Mutex<Option<Host<E>>>,
    n: usize,
    pool: Arc<StagingPool<E>>,
}

impl<E: DeviceCopy> Drop for Arrived<E> {
    fn drop(&mut self) {
        let host = self
            .host
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(Host::Pinned(s)) = host {
            self.pool.put(s);
        }
    }
}

struct StagedLanding<E: DeviceCopy> {
    arrived: Option<Arrived<E>>,
}

impl<E: DeviceCopy + bytemuck::Pod> Landing for StagedLanding<E> {
    fn ptr(&mut self) -> *mut u8 {
        let host = self
            .arrived
            .as_mut()
            .and_then(|a| a.host.get_mut().unwrap_or_else(|e| e.into_inner()).as_mut());
        match host {
            Some(Host::Pinned(s)) => s.buf.host_ptr().cast(),
            Some(Host::Pageable(v)) => v.as_mut_ptr().cast(),
            None => std::ptr::null_mut(),
        }
    }

    fn len(&self) -> usize {
        self.arrived.as_ref().map_or(0, |a| a.n) * std::mem::size_of::<E>()
    }

    unsafe fn finish(mut self: Box<Self>) -> Result<AnyValue, String> {
        let mut a = self.arrived.take().expect("finished once");
        let n = a.n;
        if let Some(Host::Pageable(v)) = a.host.get_mut().unwrap_or_else(|e| e.into_inner()) {
            // SAFETY: the capacity is `n` (allocated so in `landing`), the caller wrote all
            // their bytes, and `E: Pod` makes any bytes a valid element.
            unsafe { v.set_len(n) };
        }
        Ok(Box::new(a))
    }
}

/// The landing of a staged device value of `E`s: idle page-locked memory of `pool` (ordinary
/// memory when it has none large enough, or is gone).
pub(crate) fn landing<E: DeviceCopy + bytemuck::Pod>(pool: &Arc<StagingPool<E>>) -> LandFn {
    let pool = Arc::downgrade(pool);
    Arc::new(move |len: usize| {
        let size = std::mem::size_of::<E>();
        if size == 0 || len % size != 0 {
            return Err(format!(
                "{len} bytes are not a whole number of {} ({size} bytes each)",
                std::any::type_name::<E>()
            ));
        }
        let n = len / size;
        let pool = pool.upgrade().unwrap_or_default();
        let host = match pool.take(n) {
            Some(s) => Host::Pinned(s),
            None => Host::Pageable(Vec::with_capacity(n)),
        };
        Ok(Box::new(StagedLanding {
            arrived: Some(Arrived {
                host: Mutex::new(Some(host)),
                n,
                pool,
            }),
        }) as Box<dyn Landing>)
    })
}

/// Adds the staged receive of transfer `what.k`: the receive node, then a GPU node on
/// `what.device` that uploads the value (its output is what consumers read).
pub(crate) fn add_recv<E: DeviceCopy + bytemuck::Pod>(
    gb: &mut GraphBuilder<GpuWorker>,
    env: &Arc<SlotEnv>,
    what: RecvWhat<'_>,
) -> RecvNodes {
    let recv = add_recv_node(gb, env, what.k, what.name.clone());
    let upload = add_gpu_node(
        gb,
        env,
        what.device,
        format!("upload {}", what.name),
        what.producer,
        move |ctx| {
            let gpu = ctx.gpu();
            let received: &Received = gpu.input(recv)?;
            let a = received
                .get::<Arrived<E>>()
                .ok_or("a staged device value did not arrive")?;
            let host = a.host.lock().unwrap_or_else(|e| e.into_inner()).take();
            upload(gpu, host, a.n, &a.pool)
        },
    );
    gb.edge(recv.id(), upload.id());
    RecvNodes {
        out: upload.id(),
        nccl: None,
        mapped: Mapped::Local(Box::new(upload)),
    }
}

/// Copies `n` arrived elements to a new buffer of the node's device; page-locked memory goes
/// back to `pool` at once, guarded by its signal until the copy is done, and ordinary memory
/// leaves page-locked memory of its size there for the next arrival.
fn upload<E: DeviceCopy>(
    gpu: &GpuCtx<'_, '_>,
    host: Option<Host<E>>,
    n: usize,
    pool: &StagingPool<E>,
) -> Result<DeviceBuffer<E>, BoxError> {
    let mut dst = gpu.alloc::<E>(n)?;
    match host {
        Some(Host::Pinned(mut s)) => {
            if n > 0 {
                gpu.copy_from_pinned_at(&s.buf, 0..n, &dst, 0)?;
            }
            // On an error above `s` is dropped, and freed after the work enqueued so far.
            let next = s.free_at.wrapping_add(1);
            gpu.signal(&s.signal, next)?;
            s.free_at = next;
            pool.put(s);
        }
        Some(Host::Pageable(v)) => {
            if n > 0 {
                gpu.copy_to_device(&v, &mut dst)?;
                pool.put(Staging::new(gpu, n)?);
            }
        }
        None => return Err("a staged device value without its bytes (uploaded twice?)".into()),
    }
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_value_in_whole_elements() {
        // 64 MiB of f32 in 4 MiB chunks: 16 of 1 Mi elements.
        let c = chunks(16 << 20, 4, 4 << 20);
        assert_eq!(c.len(), 16);
        assert!(c.iter().all(|r| r.len() == 1 << 20));
        assert_eq!(c.last().unwrap().end, 16 << 20);
        // A ragged last chunk; a chunk smaller than an element still holds one.
        assert_eq!(chunks(10, 8, 24), vec![0..3, 3..6, 6..9, 9..10]);
        assert_eq!(chunks(3, 16, 1), vec![0..1, 1..2, 2..3]);
        // One chunk for a small value, one empty one for an empty value.
        let one = |c: Vec<Range<usize>>| (c.len(), c[0].clone());
        assert_eq!(one(chunks(5, 4, 4 << 20)), (1, 0..5));
        assert_eq!(one(chunks(0, 4, 4 << 20)), (1, 0..0));
    }

    // The staged send's path through the communication thread, on the host: a value whose
    // bytes become ready piece by piece (here a thread stands in for the device's copies and
    // signal), sent over the in-process network, checked on the receiver.
    mod host {
        use std::any::Any;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::time::{Duration, Instant};

        use boundpool_scheduler::backend::NodeCtxExt;
        use boundpool_scheduler::{Cores, GraphBuilder, NodeCtx, NodeId};

        use crate::comm::{Command, Payload, StagedPayload};
        use crate::graph::{NodeMaker, RankGraphBuilder, SendNodes, SlotEnv};
        use crate::plan::{NodeDesc, On, Wire};
        use crate::value::{land_fn, plain_landing, LandFn};
        use crate::{LocalNetwork, RanksBuilder};

        /// Makes `len` bytes on its rank; its send releases them `piece` bytes at a time, a
        /// piece every 200 µs, from a thread of its own.
        struct Trickle {
            len: usize,
            piece: usize,
            /// When the last piece was released (ns since `t0`).
            released: Arc<AtomicUsize>,
            t0: Instant,
        }

        fn bytes(len: usize) -> Vec<u8> {
            (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
        }

        impl NodeMaker<()> for Trickle {
            fn compute(
                &self,
                gb: &mut GraphBuilder<()>,
                _: &Arc<SlotEnv>,
                _: u32,
            ) -> (NodeId, Box<dyn Any + Send + Sync>) {
                let len = self.len;
                let r = gb.node("make", move |_: &NodeCtx<'_, ()>| Ok(bytes(len)));
                (r.id(), Box::new(r))
            }

            fn send(
                &self,
                gb: &mut GraphBuilder<()>,
                env: &Arc<SlotEnv>,
                producer: &(dyn Any + Send + Sync),
                k: u32,
                _: usize,
            ) -> SendNodes {
                let from = *producer
                    .downcast_ref::<boundpool_scheduler::NodeRef<Vec<u8>>>()
                    .unwrap();
                let (env, piece, released, t0) =
                    (env.clone(), self.piece, self.released.clone(), self.t0);
                let r = gb.node("trickle", move |ctx: &NodeCtx<'_, ()>| {
                    let v = ctx.input(from)?;
                    let ready = Arc::new(AtomicUsize::new(0));
                    let (feed, len, released) = (ready.clone(), v.len(), released.clone());
                    std::thread::spawn(move || loop {
                        std::thread::sleep(Duration::from_micros(200));
                        let now = (feed.load(Ordering::Acquire) + piece).min(len);
                        if now == len {
                            released.store(t0.elapsed().as_nanos() as usize, Ordering::Release);
                        }
                        feed.store(now, Ordering::Release);
                        if now == len {
                            break;
                        }
                    });
                    let run = env.current();
                    run.sends[k as usize].complete_on(ctx.complete_later());
                    env.comm.send(Command::Send {
                        run,
                        k,
                        payload: Payload::Staged(StagedPayload {
                            ptr: v.as_ptr(),
                            len: v.len(),
                            piece,
                            ready: Box::new(move || ready.load(Ordering::Acquire)),
                        }),
                    });
                    Ok(())
                });
                SendNodes {
                    inputs: vec![r.id()],
                    nccl: None,
                }
            }

            fn land(&self) -> Option<LandFn> {
                Some(land_fn(plain_landing::<Vec<u8>>))
            }
        }

        /// Sends values of `lens` from rank 0 to rank 1 in pieces of `piece` bytes, messages of
        /// at most `max` bytes; checks the bytes and that none arrived before all were ready.
        fn trickle(lens: &[usize], piece: usize, max: usize) {
            let net = LocalNetwork::new(2);
            let ranks: Vec<_> = (0..2)
                .map(|r| {
                    RanksBuilder::new()
                        .workers(1)
                        .cores(Cores::Unpinned)
                        .max_message_bytes(max)
                        .build_local(&net, r)
                        .unwrap()
                })
                .collect();
            // Findings are collected, not asserted inside: a rank that stopped early would
            // leave the other waiting for its next graph.
            let bad = std::sync::Mutex::new(Vec::new());
            std::thread::scope(|s| {
                for ranks in &ranks {
                    let bad = &bad;
                    s.spawn(move || {
                        for &len in lens {
                            let t0 = Instant::now();
                            let released = Arc::new(AtomicUsize::new(usize::MAX));
                            let mut g = RankGraphBuilder::<()>::new(format!("trickle {len}"));
                            let desc = NodeDesc {
                                name: "make".into(),
                                on: On::Rank(0),
                                wire: Wire::Plain,
                                type_name: std::any::type_name::<Vec<u8>>().into(),
                            };
                            let maker = Trickle {
                                len,
                                piece,
                                released: released.clone(),
                                t0,
                            };
                            let a: crate::NodeRef<Vec<u8>> = g.add_node(desc, Arc::new(maker));
                            let b = g.node(1, "check", move |ctx| Ok(ctx.input(a)? == &bytes(len)));
                            g.edge(a, b);
                            let out = ranks.run(&g.build(ranks).unwrap()).unwrap();
                            if ranks.rank() == 1 && !out.get(b).unwrap() {
                                bad.lock()
                                    .unwrap()
                                    .push(format!("{len} bytes arrived changed"));
                            }
                            // The value went out piece by piece: its send ended after the last.
                            if ranks.rank() == 0
                                && len > piece
                                && released.load(Ordering::Acquire) == usize::MAX
                            {
                                bad.lock().unwrap().push(format!(
                                    "{len} bytes were sent before they were all ready"
                                ));
                            }
                        }
                    });
                }
            });
            let bad = bad.into_inner().unwrap();
            assert!(bad.is_empty(), "{bad:?}");
        }

        #[test]
        fn staged_values_go_out_piece_by_piece_and_arrive_whole() {
            // Messages of a piece (1000 bytes): whole values, long ones (header and chunks,
            // the last short), an empty one.
            trickle(&[0, 10, 1000, 1001, 64_000, 100_003], 1000, 1 << 20);
            // Messages smaller than a piece (the runtime's limit).
            trickle(&[5000, 12_345], 4096, 1000);
        }
    }
}

//! Device values staged through page-locked host memory (the device machine's MPI is not
//! CUDA-aware).
//!
//! * **Send**: a GPU node on the producer's device copies the buffer into page-locked staging
//!   memory chunk by chunk, each copy followed by a write of a [`HostSignal`] (the count of
//!   chunks done), and hands the communication thread a staged payload that reads the signal:
//!   chunk `i` is sent once the signal passed it, while the device copies chunk `i + 1`. A
//!   host node after it completes when the transport is done (the send cell). The staging
//!   memory and the signal belong to the send's run slot and are reused by its later runs.
//! * **Receive**: the value lands in page-locked memory of the receive's pool (a landing made
//!   by the communication thread without a driver call: a buffer the upload node allocated
//!   for an earlier run), and a GPU node on the consumer's device uploads it. The first run,
//!   whose pool is empty, lands in ordinary memory (uploaded through the driver's staging)
//!   and leaves a page-locked buffer of its size in the pool for the next.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use boundpool_gpu::{DeviceBuffer, DeviceCopy, GpuCtx, GpuWorker, HostSignal, PinnedBuffer};
use boundpool_scheduler::backend::NodeCtxExt;
use boundpool_scheduler::{BoxError, GraphBuilder, NodeCtx};

use crate::comm::{Command, Payload, StagedPayload};
use crate::gpu::nodes::{add_gpu_node, RecvWhat, SendWhat};
use crate::graph::{add_recv as add_recv_node, Mapped, Received, RecvNodes, SendNodes, SlotEnv};
use crate::value::{AnyValue, LandFn, Landing};

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

/// A send's staging memory and its signal, reused by the runs of one slot (a slot's runs
/// follow each other: the previous send finished before the next run starts).
struct Stage<E: DeviceCopy> {
    pinned: Arc<PinnedBuffer<E>>,
    signal: Arc<HostSignal>,
    /// The signal's value after the last run's chunks: each run counts on from there.
    next: u32,
}

/// Adds the staged send of `what.from`'s buffer to rank `what.to`: a GPU node that stages it,
/// then a host node that completes once it is sent.
pub(crate) fn add_send<E: DeviceCopy>(
    gb: &mut GraphBuilder<GpuWorker>,
    env: &Arc<SlotEnv>,
    what: SendWhat<'_, E>,
    chunk: usize,
) -> SendNodes {
    let stage: Arc<Mutex<Option<Stage<E>>>> = Arc::new(Mutex::new(None));
    let (from, k) = (what.from, what.k);
    let senv = env.clone();
    let stager = add_gpu_node(
        gb,
        env,
        what.device,
        format!("stage '{}' for rank {}", what.name, what.to),
        what.producer,
        move |ctx| {
            let gpu = ctx.gpu();
            let buf = gpu.input(from)?;
            let payload = stage_out(gpu, buf, &stage, chunk)?;
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
    SendNodes {
        inputs: vec![stager.id()],
        nccl: None,
    }
}

/// Enqueues the chunks' copies of `buf` into the slot's staging memory, each followed by its
/// signal, and returns the payload that sends them as they are done.
fn stage_out<E: DeviceCopy>(
    gpu: &GpuCtx<'_, '_>,
    buf: &DeviceBuffer<E>,
    stage: &Mutex<Option<Stage<E>>>,
    chunk: usize,
) -> Result<StagedPayload, BoxError> {
    let mut slot = stage.lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_none_or(|s| s.pinned.len() < buf.len()) {
        let signal = match slot.take() {
            Some(s) => s.signal,
            None => Arc::new(gpu.host_signal()?),
        };
        let next = signal.value();
        *slot = Some(Stage {
            pinned: Arc::new(gpu.alloc_pinned::<E>(buf.len().max(1))?),
            signal,
            next,
        });
    }
    let s = slot.as_mut().expect("made above");
    let size = std::mem::size_of::<E>();
    let pieces = chunks(buf.len(), size, chunk);
    let base = s.next;
    for (i, r) in pieces.iter().enumerate() {
        if !r.is_empty() {
            gpu.copy_to_pinned_at(buf, r.clone(), &s.pinned, r.start)?;
        }
        gpu.signal(&s.signal, base.wrapping_add(i as u32 + 1))?;
    }
    s.next = base.wrapping_add(pieces.len() as u32);
    let len = buf.len() * size;
    let piece = pieces[0].len().max(1) * size;
    let (signal, pinned) = (s.signal.clone(), s.pinned.clone());
    Ok(StagedPayload {
        ptr: pinned.host_ptr() as *const u8,
        len,
        piece,
        ready: Box::new(move || {
            let _keep = &pinned;
            let done = signal.value().wrapping_sub(base) as usize;
            done.min(pieces.len()).saturating_mul(piece).min(len)
        }),
    })
}

/// The page-locked buffers a receive's values land in, reused across runs. Its node's maker
/// owns it (the graph: dropped on the user's thread, its buffers freed by a bound worker); the
/// landing, which the communication thread keeps until it ends, holds it weakly.
pub(crate) struct StagingPool<E: DeviceCopy> {
    free: Mutex<Vec<PinnedBuffer<E>>>,
}

impl<E: DeviceCopy> Default for StagingPool<E> {
    fn default() -> Self {
        StagingPool {
            free: Mutex::new(Vec::new()),
        }
    }
}

impl<E: DeviceCopy> StagingPool<E> {
    /// A free buffer of at least `n` elements (the smallest such).
    fn take(&self, n: usize) -> Option<PinnedBuffer<E>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= n)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i)?;
        Some(free.swap_remove(best))
    }

    fn put(&self, b: PinnedBuffer<E>) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(b);
    }
}

/// Where an arrived device value's bytes are on the host.
enum Host<E: DeviceCopy> {
    /// Page-locked memory of the pool (its first `n` elements).
    Pinned(PinnedBuffer<E>),
    /// Ordinary memory (the pool had no buffer large enough).
    Pageable(Vec<E>),
}

/// A device value that arrived on this rank, waiting for its upload. Dropped (with its run),
/// it gives its page-locked buffer back to the pool.
pub(crate) struct Arrived<E: DeviceCopy> {
    host: Option<Host<E>>,
    n: usize,
    pool: Arc<StagingPool<E>>,
}

impl<E: DeviceCopy> Drop for Arrived<E> {
    fn drop(&mut self) {
        if let Some(Host::Pinned(b)) = self.host.take() {
            self.pool.put(b);
        }
    }
}

struct StagedLanding<E: DeviceCopy> {
    arrived: Option<Arrived<E>>,
}

impl<E: DeviceCopy + bytemuck::Pod> Landing for StagedLanding<E> {
    fn ptr(&mut self) -> *mut u8 {
        match self.arrived.as_mut().and_then(|a| a.host.as_mut()) {
            Some(Host::Pinned(b)) => b.host_ptr().cast(),
            Some(Host::Pageable(v)) => v.as_mut_ptr().cast(),
            None => std::ptr::null_mut(),
        }
    }

    fn len(&self) -> usize {
        self.arrived.as_ref().map_or(0, |a| a.n) * std::mem::size_of::<E>()
    }

    unsafe fn finish(mut self: Box<Self>) -> Result<AnyValue, String> {
        let mut a = self.arrived.take().expect("finished once");
        if let Some(Host::Pageable(v)) = a.host.as_mut() {
            // SAFETY: the capacity is `n` (allocated so in `landing`), the caller wrote all
            // their bytes, and `E: Pod` makes any bytes a valid element.
            unsafe { v.set_len(a.n) };
        }
        Ok(Box::new(a))
    }
}

/// The landing of a staged device value of `E`s: page-locked memory of `pool` (ordinary memory
/// when it has none large enough, or is gone).
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
            Some(b) => Host::Pinned(b),
            None => Host::Pageable(Vec::with_capacity(n)),
        };
        Ok(Box::new(StagedLanding {
            arrived: Some(Arrived {
                host: Some(host),
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
            let dst = gpu.alloc::<E>(a.n)?;
            match a.host.as_ref() {
                _ if a.n == 0 => {}
                Some(Host::Pinned(b)) => gpu.copy_from_pinned_at(b, 0..a.n, &dst, 0)?,
                Some(Host::Pageable(v)) => {
                    let mut dst = dst;
                    gpu.copy_to_device(v, &mut dst)?;
                    // Page-locked memory of this size for the next run's arrival.
                    a.pool.put(gpu.alloc_pinned::<E>(a.n.max(1))?);
                    return Ok(dst);
                }
                None => return Err("a staged device value without its bytes".into()),
            }
            Ok(dst)
        },
    );
    gb.edge(recv.id(), upload.id());
    RecvNodes {
        out: upload.id(),
        nccl: None,
        mapped: Mapped::Local(Box::new(upload)),
    }
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

//! The MPI transport (rsmpi 0.8): MPI initialized, used and finalized by the communication
//! thread, through non-blocking calls only (`MPI_Isend`, `MPI_Improbe`, `MPI_Imrecv`,
//! `MPI_Test`, `MPI_Testsome`). rsmpi's safe layer starts and ends MPI; the calls themselves go
//! through its `ffi` module, since the buffers live as long as the protocol says (a run's
//! output, a landing), not a Rust scope. Where MPI gives `MPI_THREAD_MULTIPLE`, workers post
//! small sends themselves (`MPI_Isend`, then one `MPI_Test`: a small message on shared memory
//! is done in the call) through [`MpiDirect`], which the communication thread closes before it
//! finalizes MPI.
//!
//! The posted lane (`Transport::lane`) is a second duplicate of `MPI_COMM_WORLD` with a ring of
//! [`LANE_RECEIVES`] receives of [`LANE_BYTES`] posted ahead (any source, any tag): a message
//! matches the oldest, so `lane_take` tests the ring's head alone and posts it again at the
//! tail. Cancelled at a clean close.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::{Arc, RwLock};

use ::mpi::environment::Universe;
use ::mpi::ffi;
use ::mpi::Threading;

use crate::error::{Error, ErrorKind};
use crate::transport::{DirectSend, InFlight, OpId, Probed, Transport};

/// The posted lane's largest message (Open MPI's shared memory sends this much eagerly).
const LANE_BYTES: usize = 4096;
/// Receives posted ahead on the lane; more messages wait in MPI's unexpected queue.
const LANE_RECEIVES: usize = 32;

/// Ranks over MPI, on a duplicate of `MPI_COMM_WORLD` whose errors are returned, not fatal.
pub struct MpiTransport {
    universe: Option<Universe>,
    comm: ffi::MPI_Comm,
    /// The posted lane: its communicator, its ring of receives and their memory, the oldest.
    lane_comm: ffi::MPI_Comm,
    lane_ring: Vec<ffi::MPI_Request>,
    lane_memory: Box<[u8]>,
    lane_head: usize,
    rank: usize,
    size: usize,
    max_tag: u32,
    threading: Threading,
    requests: Vec<ffi::MPI_Request>,
    ops: Vec<OpId>,
    indices: Vec<c_int>,
    statuses: Vec<ffi::MPI_Status>,
    /// Operations done when they started (`finished`, or the next `poll`, reports them).
    ready: Vec<OpId>,
    /// The bytes of adopted direct sends, until they are done.
    adopted: HashMap<OpId, Box<[u8]>>,
    /// Workers' sends, where MPI allows them (`Threading::Multiple`).
    direct: Option<Arc<MpiDirect>>,
}

impl std::fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiTransport")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("max_tag", &self.max_tag)
            .field("threading", &self.threading)
            .field("in_flight", &self.ops.len())
            .finish()
    }
}

/// A duplicate of `MPI_COMM_WORLD` whose errors are returned.
fn dup_world() -> Result<ffi::MPI_Comm, Error> {
    let mut comm = MaybeUninit::<ffi::MPI_Comm>::uninit();
    // SAFETY: MPI is initialized; `comm` receives the new communicator.
    let rc = unsafe { ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, comm.as_mut_ptr()) };
    check(usize::MAX, "MPI_Comm_dup", rc)?;
    // SAFETY: MPI_Comm_dup succeeded and wrote it.
    let comm = unsafe { comm.assume_init() };
    // SAFETY: a valid communicator.
    let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) };
    check(usize::MAX, "MPI_Comm_set_errhandler", rc)?;
    Ok(comm)
}

/// `MPI_Error_string` of `code`.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as the call requires.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error {code}");
    }
    let bytes: Vec<u8> = buf[..len.max(0) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn check(rank: usize, what: &str, rc: c_int) -> Result<(), Error> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Transport,
            format!("rank {rank}: {what} failed: {}", error_string(rc)),
        ))
    }
}

fn bytes_type() -> ffi::MPI_Datatype {
    // SAFETY: a constant rsmpi's C shim initializes before main.
    unsafe { ffi::RSMPI_UINT8_T }
}

impl MpiTransport {
    /// Initializes MPI on this thread (asking for `MPI_THREAD_MULTIPLE`, needing at least
    /// `MPI_THREAD_FUNNELED`: only this thread calls MPI) and duplicates `MPI_COMM_WORLD`.
    pub fn init() -> Result<Self, Error> {
        let (universe, threading) = ::mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidConfig,
                    "MPI is already initialized in this process: the ranks runtime owns MPI \
                     (one runtime per process, and no other MPI use)",
                )
            })?;
        if threading < Threading::Funneled {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("the MPI library gives only {threading:?} threading; ranks need Funneled"),
            ));
        }
        let comm = dup_world()?;
        let lane_comm = dup_world()?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: a valid communicator and out-pointers to ints.
        unsafe {
            check(
                usize::MAX,
                "MPI_Comm_rank",
                ffi::MPI_Comm_rank(comm, &mut rank),
            )?;
            check(
                usize::MAX,
                "MPI_Comm_size",
                ffi::MPI_Comm_size(comm, &mut size),
            )?;
        }
        let rank = rank as usize;
        let mut value: *mut c_int = std::ptr::null_mut();
        let mut flag: c_int = 0;
        // SAFETY: MPI_TAG_UB's attribute value is a pointer to an int, written into `value`.
        let rc = unsafe {
            ffi::MPI_Comm_get_attr(
                comm,
                ffi::MPI_TAG_UB as c_int,
                (&mut value as *mut *mut c_int).cast::<c_void>(),
                &mut flag,
            )
        };
        check(rank, "MPI_Comm_get_attr(MPI_TAG_UB)", rc)?;
        let max_tag = if flag != 0 && !value.is_null() {
            // SAFETY: MPI set the flag, so `value` points at the attribute's int.
            (unsafe { *value }).max(32767) as u32
        } else {
            32767
        };
        let mut t = MpiTransport {
            universe: Some(universe),
            comm,
            lane_comm,
            lane_ring: Vec::with_capacity(LANE_RECEIVES),
            lane_memory: vec![0u8; LANE_BYTES * LANE_RECEIVES].into_boxed_slice(),
            lane_head: 0,
            rank,
            size: size as usize,
            max_tag,
            threading,
            requests: Vec::new(),
            ops: Vec::new(),
            indices: Vec::new(),
            statuses: Vec::new(),
            ready: Vec::new(),
            adopted: HashMap::new(),
            direct: (threading == Threading::Multiple).then(|| {
                Arc::new(MpiDirect {
                    comm: Comm(comm),
                    lane: Comm(lane_comm),
                    rank,
                    closed: RwLock::new(false),
                })
            }),
        };
        for i in 0..LANE_RECEIVES {
            // SAFETY: MPI is initialized; `lane_ring` has room for every slot.
            let req = unsafe { t.post_lane(i)? };
            t.lane_ring.push(req);
        }
        Ok(t)
    }

    /// Posts the lane's receive `i` into its slot of the lane's memory.
    ///
    /// # Safety
    /// Slot `i` has no receive in flight (its last one completed, or none was posted).
    unsafe fn post_lane(&mut self, i: usize) -> Result<ffi::MPI_Request, Error> {
        let slot = &mut self.lane_memory[i * LANE_BYTES..][..LANE_BYTES];
        let mut req = MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: `slot` is LANE_BYTES of the lane's memory, which lives as long as the
        // transport and is not moved (a boxed slice); no other receive writes it (the caller's
        // promise); MPI is initialized and the lane's communicator valid until `close`.
        let rc = unsafe {
            ffi::MPI_Irecv(
                slot.as_mut_ptr().cast::<c_void>(),
                LANE_BYTES as c_int,
                bytes_type(),
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                self.lane_comm,
                req.as_mut_ptr(),
            )
        };
        check(self.rank, "MPI_Irecv (the posted lane)", rc)?;
        // SAFETY: MPI_Irecv succeeded and wrote the request.
        Ok(unsafe { req.assume_init() })
    }

    /// Cancels the lane's receives and frees its communicator (a clean close: no peer sends
    /// on it any more).
    fn close_lane(&mut self) {
        for req in &mut self.lane_ring {
            // SAFETY: a receive this transport posted and nobody completed; after MPI_Cancel,
            // MPI_Wait returns without waiting for a message (MPI 3.1, 3.8.4).
            unsafe {
                ffi::MPI_Cancel(req);
                ffi::MPI_Wait(req, ffi::RSMPI_STATUS_IGNORE);
            }
        }
        self.lane_ring.clear();
        // SAFETY: our communicator, with nothing in flight on it.
        unsafe {
            ffi::MPI_Comm_free(&mut self.lane_comm);
        }
    }

    /// The thread level MPI gave.
    pub fn threading(&self) -> Threading {
        self.threading
    }

    /// Keeps `req` (of `op`) for `poll`, or reports it done at once if `MPI_Test` says so.
    fn track(&mut self, mut req: ffi::MPI_Request, op: OpId) -> Result<(), Error> {
        if test(&mut req, self.rank)? {
            self.ready.push(op);
        } else {
            self.requests.push(req);
            self.ops.push(op);
        }
        Ok(())
    }

    fn count(len: usize, rank: usize) -> Result<c_int, Error> {
        c_int::try_from(len).map_err(|_| {
            Error::new(
                ErrorKind::Transport,
                format!("rank {rank}: a message of {len} bytes is past MPI's count (not split?)"),
            )
        })
    }
}

impl Transport for MpiTransport {
    type Message = ffi::MPI_Message;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn max_tag(&self) -> u32 {
        self.max_tag
    }

    /// `MPI_Get_processor_name` (the host's name under Open MPI, MPICH and Slurm), hashed,
    /// gathered from every rank with `MPI_Allgather`: blocking, once at start-up, where every
    /// rank makes its transport together (as `MPI_Init` itself).
    fn hosts(&mut self) -> Result<Vec<usize>, Error> {
        let mut name = vec![0 as c_char; ffi::MPI_MAX_PROCESSOR_NAME as usize + 1];
        let mut len: c_int = 0;
        // SAFETY: the buffer holds MPI_MAX_PROCESSOR_NAME characters and the terminator.
        let rc = unsafe { ffi::MPI_Get_processor_name(name.as_mut_ptr(), &mut len) };
        check(self.rank, "MPI_Get_processor_name", rc)?;
        let mut key = 0xcbf2_9ce4_8422_2325u64;
        for &c in &name[..len.clamp(0, ffi::MPI_MAX_PROCESSOR_NAME as c_int) as usize] {
            key = (key ^ u64::from(c as u8)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut keys = vec![0u64; self.size];
        // SAFETY: one u64 sent from `key`, one per rank received into `keys` (`size` of them),
        // on this transport's valid communicator; only this thread calls MPI now.
        let rc = unsafe {
            ffi::MPI_Allgather(
                (&key as *const u64).cast::<c_void>(),
                1,
                ffi::RSMPI_UINT64_T,
                keys.as_mut_ptr().cast::<c_void>(),
                1,
                ffi::RSMPI_UINT64_T,
                self.comm,
            )
        };
        check(self.rank, "MPI_Allgather (the ranks' hosts)", rc)?;
        Ok(crate::transport::hosts_from_keys(&keys))
    }

    unsafe fn send(
        &mut self,
        to: usize,
        tag: u32,
        data: *const u8,
        len: usize,
        op: OpId,
    ) -> Result<(), Error> {
        // SAFETY: the caller keeps the bytes valid until `op` is reported done, which happens
        // only once MPI_Testsome completes this request.
        let req = unsafe { isend(self.comm, self.rank, to, tag, data, len)? };
        self.requests.push(req);
        self.ops.push(op);
        Ok(())
    }

    fn lane(&self) -> usize {
        LANE_BYTES
    }

    unsafe fn lane_send(
        &mut self,
        to: usize,
        data: *const u8,
        len: usize,
        op: OpId,
    ) -> Result<(), Error> {
        if len > LANE_BYTES {
            return Err(past_lane(self.rank, to, len));
        }
        // SAFETY: the caller keeps the bytes valid until `op` is reported done, which happens
        // only once MPI_Testsome completes this request.
        let req = unsafe { isend(self.lane_comm, self.rank, to, 0, data, len)? };
        self.requests.push(req);
        self.ops.push(op);
        Ok(())
    }

    fn lane_take(&mut self, take: &mut dyn FnMut(usize, &[u8])) -> Result<bool, Error> {
        let i = self.lane_head;
        let Some(req) = self.lane_ring.get_mut(i) else {
            return Ok(false);
        };
        let mut flag: c_int = 0;
        // SAFETY: MPI_Status is a plain C struct; zeroes are a valid value to overwrite.
        let mut status: ffi::MPI_Status = unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: a receive this transport posted and nobody completed yet.
        let rc = unsafe { ffi::MPI_Test(req, &mut flag, &mut status) };
        check(self.rank, "MPI_Test (the posted lane)", rc)?;
        if flag == 0 {
            return Ok(false);
        }
        let mut count: c_int = 0;
        // SAFETY: a status MPI filled in.
        let rc = unsafe { ffi::MPI_Get_count(&status, bytes_type(), &mut count) };
        check(self.rank, "MPI_Get_count", rc)?;
        let len = (count.max(0) as usize).min(LANE_BYTES);
        take(
            status.MPI_SOURCE as usize,
            &self.lane_memory[i * LANE_BYTES..][..len],
        );
        // SAFETY: slot `i`'s receive completed above.
        self.lane_ring[i] = unsafe { self.post_lane(i)? };
        self.lane_head = (i + 1) % LANE_RECEIVES;
        Ok(true)
    }

    fn probe(&mut self) -> Result<Option<Probed<ffi::MPI_Message>>, Error> {
        let mut flag: c_int = 0;
        let mut message = MaybeUninit::<ffi::MPI_Message>::uninit();
        let mut status = MaybeUninit::<ffi::MPI_Status>::uninit();
        // SAFETY: MPI is initialized on this thread; out-pointers to the flag, message and
        // status, read only when the flag says a message matched.
        let rc = unsafe {
            ffi::MPI_Improbe(
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                self.comm,
                &mut flag,
                message.as_mut_ptr(),
                status.as_mut_ptr(),
            )
        };
        check(self.rank, "MPI_Improbe", rc)?;
        if flag == 0 {
            return Ok(None);
        }
        // SAFETY: a message matched, so MPI wrote the message handle and the status.
        let (message, status) = unsafe { (message.assume_init(), status.assume_init()) };
        let mut count: c_int = 0;
        // SAFETY: a status MPI filled in.
        let rc = unsafe { ffi::MPI_Get_count(&status, bytes_type(), &mut count) };
        check(self.rank, "MPI_Get_count", rc)?;
        Ok(Some(Probed {
            from: status.MPI_SOURCE as usize,
            tag: status.MPI_TAG as u32,
            len: count.max(0) as usize,
            message,
        }))
    }

    unsafe fn receive(
        &mut self,
        message: Probed<ffi::MPI_Message>,
        into: *mut u8,
        op: OpId,
    ) -> Result<(), Error> {
        let count = Self::count(message.len, self.rank)?;
        let mut handle = message.message;
        let mut req = MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: the caller keeps `message.len` bytes at `into` writable until `op` is
        // reported; the message handle came from MPI_Improbe and is used once.
        let rc = unsafe {
            ffi::MPI_Imrecv(
                into.cast::<c_void>(),
                count,
                bytes_type(),
                &mut handle,
                req.as_mut_ptr(),
            )
        };
        check(
            self.rank,
            &format!("MPI_Imrecv from rank {}", message.from),
            rc,
        )?;
        // SAFETY: MPI_Imrecv succeeded and wrote the request. A message already here (a small
        // one) is done at once: `finished` reports it without a `Testsome` round.
        self.track(unsafe { req.assume_init() }, op)
    }

    fn finished(&mut self, done: &mut Vec<OpId>) {
        done.append(&mut self.ready);
    }

    /// At `MPI_THREAD_SERIALIZED` or `MPI_THREAD_MULTIPLE`: any thread may call MPI while
    /// calls do not overlap (the engine's lock sees to that; workers' direct sends, at
    /// `MULTIPLE` only, may overlap).
    fn any_thread(&self) -> bool {
        self.threading >= Threading::Serialized
    }

    fn direct(&mut self) -> Option<Arc<dyn DirectSend>> {
        self.direct.clone().map(|d| -> Arc<dyn DirectSend> { d })
    }

    fn adopt(&mut self, sent: InFlight, op: OpId) {
        let Ok(sent) = sent.into_record().downcast::<MpiInFlight>() else {
            unreachable!("only this transport's direct sends are adopted here")
        };
        let MpiInFlight { request, bytes } = *sent;
        self.adopted.insert(op, bytes);
        self.requests.push(request.0);
        self.ops.push(op);
    }

    fn poll(&mut self, done: &mut Vec<OpId>) -> Result<(), Error> {
        done.append(&mut self.ready);
        if self.requests.is_empty() {
            // Let MPI make progress on what others send us even with nothing of ours in flight
            // (the next probe would too; this keeps `poll` meaningful on its own).
            return Ok(());
        }
        let n = self.requests.len();
        self.indices.resize(n, 0);
        // SAFETY: MPI_Status is a plain C struct; zeroes are a valid (unused) value.
        self.statuses
            .resize_with(n, || unsafe { MaybeUninit::zeroed().assume_init() });
        let mut outcount: c_int = 0;
        // SAFETY: `n` requests, and arrays of `n` indices and statuses for MPI to fill.
        let rc = unsafe {
            ffi::MPI_Testsome(
                n as c_int,
                self.requests.as_mut_ptr(),
                &mut outcount,
                self.indices.as_mut_ptr(),
                self.statuses.as_mut_ptr(),
            )
        };
        if rc == ffi::MPI_ERR_IN_STATUS as c_int {
            let bad = (0..outcount.max(0) as usize)
                .map(|k| self.statuses[k].MPI_ERROR)
                .find(|&e| e != ffi::MPI_SUCCESS as c_int)
                .unwrap_or(rc);
            return check(self.rank, "a send or receive", bad);
        }
        check(self.rank, "MPI_Testsome", rc)?;
        if outcount <= 0 {
            return Ok(());
        }
        let mut finished: Vec<usize> = self.indices[..outcount as usize]
            .iter()
            .map(|&i| i as usize)
            .collect();
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for i in finished {
            self.requests.swap_remove(i);
            let op = self.ops.swap_remove(i);
            if !self.adopted.is_empty() {
                self.adopted.remove(&op);
            }
            done.push(op);
        }
        Ok(())
    }

    fn close(mut self, clean: bool) {
        if let Some(d) = &self.direct {
            // No worker's send may reach MPI from now on (one in its call finishes first).
            *d.closed.write().unwrap_or_else(|p| p.into_inner()) = true;
        }
        if !self.adopted.is_empty() {
            // MPI may still read them (only with requests in flight: MPI is not finalized).
            std::mem::forget(std::mem::take(&mut self.adopted));
        }
        if clean && self.requests.is_empty() {
            self.close_lane();
            // SAFETY: our communicator, with nothing in flight.
            unsafe {
                ffi::MPI_Comm_free(&mut self.comm);
            }
            // Dropping the universe calls MPI_Finalize on this thread, which initialized it.
            drop(self.universe.take());
        } else {
            // With requests in flight or a dead peer, MPI_Finalize may wait for ever: leave MPI
            // as it is; the process is expected to exit.
            std::mem::forget(self.universe.take());
        }
    }
}

/// `MPI_Isend` of `len` bytes at `data` to `to` on `comm`.
///
/// # Safety
/// MPI is initialized and not finalized, `comm` is valid, and the bytes stay valid and
/// unchanged until the request completes.
unsafe fn isend(
    comm: ffi::MPI_Comm,
    rank: usize,
    to: usize,
    tag: u32,
    data: *const u8,
    len: usize,
) -> Result<ffi::MPI_Request, Error> {
    let count = MpiTransport::count(len, rank)?;
    let mut req = MaybeUninit::<ffi::MPI_Request>::uninit();
    // SAFETY: the caller's promises.
    let rc = unsafe {
        ffi::MPI_Isend(
            data.cast::<c_void>(),
            count,
            bytes_type(),
            to as c_int,
            tag as c_int,
            comm,
            req.as_mut_ptr(),
        )
    };
    check(rank, &format!("MPI_Isend to rank {to}"), rc)?;
    // SAFETY: MPI_Isend succeeded and wrote the request.
    Ok(unsafe { req.assume_init() })
}

/// A lane message past the lane's size.
fn past_lane(rank: usize, to: usize, len: usize) -> Error {
    Error::new(
        ErrorKind::Transport,
        format!("rank {rank}: {len} bytes to rank {to} on a posted lane of {LANE_BYTES}"),
    )
}

/// `MPI_Test` of `req`: whether it is done (MPI then frees it).
fn test(req: &mut ffi::MPI_Request, rank: usize) -> Result<bool, Error> {
    let mut flag: c_int = 0;
    // SAFETY: a request MPI gave and nobody completed yet; the status is ignored.
    let rc = unsafe { ffi::MPI_Test(req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
    check(rank, "MPI_Test", rc)?;
    Ok(flag != 0)
}

/// The duplicated communicator, for workers' sends.
#[derive(Clone, Copy)]
struct Comm(ffi::MPI_Comm);

// SAFETY: an MPI handle is a value MPI reads; at `MPI_THREAD_MULTIPLE` (the only level at
// which `MpiDirect` exists) any thread may pass it to MPI calls, and it is not freed until
// `close` closed the direct handle and waited for every send in progress.
unsafe impl Send for Comm {}
// SAFETY: as for `Send`: the handle is only read.
unsafe impl Sync for Comm {}

/// A request in flight, moved from a worker to the communication thread.
struct Request(ffi::MPI_Request);

// SAFETY: at `MPI_THREAD_MULTIPLE` a request may be completed on another thread than the one
// that started it; it moves once, to the communication thread, which alone tests it.
unsafe impl Send for Request {}

/// A worker's send still in flight after its `MPI_Test`, and its bytes.
struct MpiInFlight {
    request: Request,
    bytes: Box<[u8]>,
}

/// Workers' small sends at `MPI_THREAD_MULTIPLE` ([`Transport::direct`]). A read lock around
/// each send, the write lock when the transport closes: no send reaches MPI after that.
struct MpiDirect {
    comm: Comm,
    lane: Comm,
    rank: usize,
    closed: RwLock<bool>,
}

impl std::fmt::Debug for MpiDirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiDirect")
            .field("rank", &self.rank)
            .finish()
    }
}

impl MpiDirect {
    fn post(
        &self,
        comm: Comm,
        to: usize,
        tag: u32,
        bytes: Box<[u8]>,
    ) -> Result<Option<InFlight>, Error> {
        let closed = self.closed.read().unwrap_or_else(|p| p.into_inner());
        if *closed {
            return Err(Error::new(
                ErrorKind::ShutDown,
                format!("rank {}: the MPI transport has closed", self.rank),
            ));
        }
        // SAFETY: MPI is initialized at MPI_THREAD_MULTIPLE and not finalized (the read lock
        // holds `close` off); `bytes` stay alive until the request is done: dropped here only
        // once MPI_Test says so, or moved with the request to the communication thread.
        let mut req = unsafe { isend(comm.0, self.rank, to, tag, bytes.as_ptr(), bytes.len())? };
        match test(&mut req, self.rank) {
            Ok(true) => return Ok(None),
            Ok(false) => {}
            Err(e) => {
                // MPI may still read them.
                std::mem::forget(bytes);
                return Err(e);
            }
        }
        Ok(Some(InFlight::new(Box::new(MpiInFlight {
            request: Request(req),
            bytes,
        }))))
    }
}

impl DirectSend for MpiDirect {
    fn send(&self, to: usize, tag: u32, bytes: Box<[u8]>) -> Result<Option<InFlight>, Error> {
        self.post(self.comm, to, tag, bytes)
    }

    fn send_lane(&self, to: usize, bytes: Box<[u8]>) -> Result<Option<InFlight>, Error> {
        if bytes.len() > LANE_BYTES {
            return Err(past_lane(self.rank, to, bytes.len()));
        }
        self.post(self.lane, to, 0, bytes)
    }
}

impl Drop for MpiTransport {
    fn drop(&mut self) {
        // Reached only through `close` (which took the universe) or an unwinding comm thread:
        // never finalize from here.
        if let Some(u) = self.universe.take() {
            std::mem::forget(u);
        }
    }
}

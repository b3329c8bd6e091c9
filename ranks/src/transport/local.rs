//! The in-process transport: ranks are threads of one process, each with a mailbox. A send
//! copies the bytes into the receiver's mailbox (so it is done at once, unless its link is
//! stalled); a receive copies them out. Any thread may send (a [`DirectSend`]). The posted
//! lane is a second mailbox per rank. Used by the
//! tests that need no `mpirun`, and by the simulator.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, ErrorKind};
use crate::transport::{DirectSend, InFlight, OpId, Probed, Transport};

struct Envelope {
    from: usize,
    tag: u32,
    bytes: Vec<u8>,
    /// On the posted lane (`Transport::lane`).
    lane: bool,
    /// Set when a stalled link lets it go: its send is done then.
    sent: Option<Arc<AtomicBool>>,
}

/// A link whose messages are held back, in order, until released.
#[derive(Default)]
struct Held {
    queue: VecDeque<Envelope>,
    /// Its sends stay in flight until then too.
    stall: bool,
    /// Only the posted lane's messages are held (the others pass them).
    lane_only: bool,
}

struct Net {
    mailboxes: Vec<Mutex<VecDeque<Envelope>>>,
    /// The posted lane's messages, per receiving rank.
    lanes: Vec<Mutex<VecDeque<Envelope>>>,
    severed: Vec<AtomicBool>,
    held: Mutex<HashMap<(usize, usize), Held>>,
    max_tag: u32,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Net {
    fn cut_off(&self, rank: usize) -> Result<(), Error> {
        if self.severed[rank].load(Ordering::SeqCst) {
            Err(Error::new(
                ErrorKind::Transport,
                format!("rank {rank}: cut off from the in-process network"),
            ))
        } else {
            Ok(())
        }
    }

    /// Puts `bytes` on the link `from -> to`; `Some(flag)`: the send stays in flight until
    /// the flag is set (a stalled link).
    fn post(
        &self,
        from: usize,
        to: usize,
        tag: u32,
        bytes: Vec<u8>,
        lane: bool,
    ) -> Option<Arc<AtomicBool>> {
        if self.severed[to].load(Ordering::SeqCst) {
            return None;
        }
        let mut e = Envelope {
            from,
            tag,
            bytes,
            lane,
            sent: None,
        };
        let mut held = lock(&self.held);
        match held.get_mut(&(from, to)) {
            Some(h) if lane || !h.lane_only => {
                let flag = h.stall.then(|| Arc::new(AtomicBool::new(false)));
                e.sent = flag.clone();
                h.queue.push_back(e);
                flag
            }
            _ => {
                lock(self.mailbox(to, lane)).push_back(e);
                None
            }
        }
    }

    fn mailbox(&self, rank: usize, lane: bool) -> &Mutex<VecDeque<Envelope>> {
        if lane {
            &self.lanes[rank]
        } else {
            &self.mailboxes[rank]
        }
    }
}

/// The posted lane's size on the in-process network (as the MPI transport's).
const LOCAL_LANE: usize = 4096;

/// A network of in-process ranks: [`endpoint`](Self::endpoint) gives each rank its transport.
#[derive(Clone)]
pub struct LocalNetwork {
    net: Arc<Net>,
}

impl std::fmt::Debug for LocalNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalNetwork")
            .field("ranks", &self.net.mailboxes.len())
            .finish()
    }
}

impl LocalNetwork {
    /// A network of `ranks` ranks whose tags go up to `i32::MAX`.
    pub fn new(ranks: usize) -> Self {
        Self::with_max_tag(ranks, i32::MAX as u32)
    }

    /// A network whose largest tag is `max_tag` (to test a small `MPI_TAG_UB`).
    pub fn with_max_tag(ranks: usize, max_tag: u32) -> Self {
        LocalNetwork {
            net: Arc::new(Net {
                mailboxes: (0..ranks).map(|_| Mutex::new(VecDeque::new())).collect(),
                lanes: (0..ranks).map(|_| Mutex::new(VecDeque::new())).collect(),
                severed: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
                held: Mutex::new(std::collections::HashMap::new()),
                max_tag,
            }),
        }
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.net.mailboxes.len()
    }

    /// Rank `rank`'s transport.
    ///
    /// # Panics
    /// If `rank` is not below [`size`](Self::size).
    pub fn endpoint(&self, rank: usize) -> LocalTransport {
        assert!(rank < self.size(), "rank {rank} of {} ranks", self.size());
        LocalTransport {
            net: self.net.clone(),
            rank,
            done: Vec::new(),
            waiting: Vec::new(),
        }
    }

    /// Holds back what `from` sends to `to` (a slow link), in order, until
    /// [`release`](Self::release); the sends are done at once.
    pub fn hold(&self, from: usize, to: usize) {
        lock(&self.net.held).entry((from, to)).or_default();
    }

    /// As [`hold`](Self::hold), for the posted lane's messages only: the others (control
    /// messages, values past the lane) pass them, as they may on MPI's two communicators.
    pub fn hold_lane(&self, from: usize, to: usize) {
        lock(&self.net.held)
            .entry((from, to))
            .or_default()
            .lane_only = true;
    }

    /// As [`hold`](Self::hold), and the sends stay in flight until the release too (a link
    /// that takes nothing more: the sender's transport reports them done only then).
    pub fn stall(&self, from: usize, to: usize) {
        lock(&self.net.held).entry((from, to)).or_default().stall = true;
    }

    /// Delivers what the link from `from` to `to` held back, in order, and stops holding
    /// (its stalled sends are done).
    pub fn release(&self, from: usize, to: usize) {
        let mut held = lock(&self.net.held);
        if let Some(h) = held.remove(&(from, to)) {
            for mut e in h.queue {
                if let Some(flag) = e.sent.take() {
                    flag.store(true, Ordering::Release);
                }
                lock(self.net.mailbox(to, e.lane)).push_back(e);
            }
        }
    }

    /// Cuts rank `rank` off, as if its process were killed: what it sends is lost, what is
    /// sent to it is dropped, and its own transport calls fail from now on.
    pub fn sever(&self, rank: usize) {
        self.net.severed[rank].store(true, Ordering::SeqCst);
        lock(&self.net.mailboxes[rank]).clear();
        lock(&self.net.lanes[rank]).clear();
    }
}

/// One rank's endpoint of a [`LocalNetwork`].
pub struct LocalTransport {
    net: Arc<Net>,
    rank: usize,
    done: Vec<OpId>,
    /// Sends on stalled links (its own, and adopted ones): done once their flag is set.
    waiting: Vec<(Arc<AtomicBool>, OpId)>,
}

impl std::fmt::Debug for LocalTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTransport")
            .field("rank", &self.rank)
            .finish()
    }
}

impl LocalTransport {
    fn check_alive(&self) -> Result<(), Error> {
        self.net.cut_off(self.rank)
    }

    /// Copies `len` bytes at `data` onto the link to `to`.
    ///
    /// # Safety
    /// `len` bytes at `data` are valid for reads during the call.
    unsafe fn post(
        &mut self,
        to: usize,
        tag: u32,
        data: *const u8,
        len: usize,
        op: OpId,
        lane: bool,
    ) -> Result<(), Error> {
        self.check_alive()?;
        let bytes = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller's promise; the bytes are copied before this returns.
            unsafe { std::slice::from_raw_parts(data, len) }.to_vec()
        };
        match self.net.post(self.rank, to, tag, bytes, lane) {
            Some(flag) => self.waiting.push((flag, op)),
            None => self.done.push(op),
        }
        Ok(())
    }
}

/// Sends of a rank's other threads (any thread may put a message in a mailbox).
struct LocalDirect {
    net: Arc<Net>,
    rank: usize,
}

impl DirectSend for LocalDirect {
    fn send(&self, to: usize, tag: u32, bytes: Box<[u8]>) -> Result<Option<InFlight>, Error> {
        self.net.cut_off(self.rank)?;
        let flag = self.net.post(self.rank, to, tag, bytes.into_vec(), false);
        Ok(flag.map(|f| InFlight::new(Box::new(f))))
    }

    fn send_lane(&self, to: usize, bytes: Box<[u8]>) -> Result<Option<InFlight>, Error> {
        self.net.cut_off(self.rank)?;
        check_lane(self.rank, to, bytes.len())?;
        let flag = self.net.post(self.rank, to, 0, bytes.into_vec(), true);
        Ok(flag.map(|f| InFlight::new(Box::new(f))))
    }
}

/// A lane message past the lane's size: an error (the caller should have known).
fn check_lane(rank: usize, to: usize, len: usize) -> Result<(), Error> {
    if len > LOCAL_LANE {
        return Err(Error::new(
            ErrorKind::Transport,
            format!("rank {rank}: {len} bytes to rank {to} on a posted lane of {LOCAL_LANE}"),
        ));
    }
    Ok(())
}

impl Transport for LocalTransport {
    type Message = Vec<u8>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.net.mailboxes.len()
    }

    fn max_tag(&self) -> u32 {
        self.net.max_tag
    }

    unsafe fn send(
        &mut self,
        to: usize,
        tag: u32,
        data: *const u8,
        len: usize,
        op: OpId,
    ) -> Result<(), Error> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.post(to, tag, data, len, op, false) }
    }

    fn lane(&self) -> usize {
        LOCAL_LANE
    }

    unsafe fn lane_send(
        &mut self,
        to: usize,
        data: *const u8,
        len: usize,
        op: OpId,
    ) -> Result<(), Error> {
        check_lane(self.rank, to, len)?;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.post(to, 0, data, len, op, true) }
    }

    fn lane_take(&mut self, take: &mut dyn FnMut(usize, &[u8])) -> Result<bool, Error> {
        self.check_alive()?;
        let e = lock(&self.net.lanes[self.rank]).pop_front();
        Ok(e.map(|e| take(e.from, &e.bytes)).is_some())
    }

    fn probe(&mut self) -> Result<Option<Probed<Vec<u8>>>, Error> {
        self.check_alive()?;
        let e = lock(&self.net.mailboxes[self.rank]).pop_front();
        Ok(e.map(|e| Probed {
            from: e.from,
            tag: e.tag,
            len: e.bytes.len(),
            message: e.bytes,
        }))
    }

    unsafe fn receive(
        &mut self,
        message: Probed<Vec<u8>>,
        into: *mut u8,
        op: OpId,
    ) -> Result<(), Error> {
        self.check_alive()?;
        if !message.message.is_empty() {
            // SAFETY: the caller gives `message.len` writable bytes at `into`.
            unsafe {
                std::ptr::copy_nonoverlapping(message.message.as_ptr(), into, message.len);
            }
        }
        self.done.push(op);
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<OpId>) -> Result<(), Error> {
        self.check_alive()?;
        done.append(&mut self.done);
        self.waiting.retain(|(flag, op)| {
            let sent = flag.load(Ordering::Acquire);
            if sent {
                done.push(*op);
            }
            !sent
        });
        Ok(())
    }

    fn finished(&mut self, done: &mut Vec<OpId>) {
        done.append(&mut self.done);
    }

    /// The network is shared memory under locks.
    fn any_thread(&self) -> bool {
        true
    }

    fn direct(&mut self) -> Option<Arc<dyn DirectSend>> {
        Some(Arc::new(LocalDirect {
            net: self.net.clone(),
            rank: self.rank,
        }))
    }

    fn adopt(&mut self, sent: InFlight, op: OpId) {
        match sent.into_record().downcast::<Arc<AtomicBool>>() {
            Ok(flag) => self.waiting.push((*flag, op)),
            Err(_) => unreachable!("only this transport's direct sends are adopted here"),
        }
    }

    fn close(self, _clean: bool) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_in_order_per_sender_and_complete_at_once() {
        let net = LocalNetwork::new(2);
        let (mut a, mut b) = (net.endpoint(0), net.endpoint(1));
        let one = [1u8, 2, 3];
        let two = [9u8];
        // SAFETY: the arrays outlive the calls, which copy them.
        unsafe {
            a.send(1, 7, one.as_ptr(), 3, 10).unwrap();
            a.send(1, 3, two.as_ptr(), 1, 11).unwrap();
        }
        let mut done = Vec::new();
        a.poll(&mut done).unwrap();
        assert_eq!(done, vec![10, 11]);
        let m = b.probe().unwrap().unwrap();
        assert_eq!((m.from, m.tag, m.len), (0, 7, 3));
        let mut buf = [0u8; 3];
        // SAFETY: `buf` has the message's 3 bytes.
        unsafe { b.receive(m, buf.as_mut_ptr(), 20).unwrap() };
        assert_eq!(buf, one);
        assert_eq!(b.probe().unwrap().unwrap().tag, 3);
        assert!(b.probe().unwrap().is_none());
    }

    #[test]
    fn the_lane_is_a_mailbox_of_its_own_and_may_be_held_alone() {
        let net = LocalNetwork::new(2);
        let (mut a, mut b) = (net.endpoint(0), net.endpoint(1));
        net.hold_lane(0, 1);
        let (small, tagged) = ([4u8, 5], [6u8]);
        // SAFETY: the arrays outlive the calls, which copy them.
        unsafe {
            a.lane_send(1, small.as_ptr(), 2, 1).unwrap();
            a.send(1, 9, tagged.as_ptr(), 1, 2).unwrap();
        }
        let mut seen = Vec::new();
        assert!(!b
            .lane_take(&mut |from, m| seen.push((from, m.to_vec())))
            .unwrap());
        assert_eq!(
            b.probe().unwrap().unwrap().tag,
            9,
            "the tagged message passed"
        );
        net.release(0, 1);
        assert!(b
            .lane_take(&mut |from, m| seen.push((from, m.to_vec())))
            .unwrap());
        assert_eq!(seen, vec![(0, vec![4, 5])]);
        assert!(b.probe().unwrap().is_none(), "lane messages are not probed");
        let big = vec![0u8; LOCAL_LANE + 1];
        // SAFETY: as above.
        assert!(unsafe { a.lane_send(1, big.as_ptr(), big.len(), 3) }.is_err());
    }

    #[test]
    fn a_severed_rank_neither_sends_nor_receives() {
        let net = LocalNetwork::new(2);
        let (mut a, mut b) = (net.endpoint(0), net.endpoint(1));
        net.sever(1);
        // SAFETY: zero bytes.
        unsafe { a.send(1, 1, [].as_ptr(), 0, 1).unwrap() };
        assert!(b.probe().is_err());
        // SAFETY: zero bytes.
        assert!(unsafe { b.send(0, 1, [].as_ptr(), 0, 2) }.is_err());
        assert!(a.probe().unwrap().is_none());
    }
}

//! The window of sends in flight on the engine's side (the shared counts: `comm/send.rs`): a
//! send whose graph's tags are known is posted at once while the window has room and nothing
//! waits; otherwise it waits in a queue, the most urgent first (its transfer's `priority`, the
//! critical path's sends ahead), then in the order it came, and goes as sends in flight
//! finish. A run's status must follow all its data on the wire (the receiver counts a sender's
//! statuses to number its runs), so a run that ended here with sends still queued sends its
//! status once the last of them is posted; shutting down posts the whole queue first. Once a
//! peer is gone, sends to it may never finish: the window no longer holds any send back.

use std::cmp::Ordering;

use super::*;

/// A send waiting for room in the window.
pub(super) struct QueuedSend {
    priority: u32,
    /// Its place among the sends queued so far (earlier first among equals).
    order: u64,
    layout: TagLayout,
    run: Arc<RunState>,
    k: u32,
    payload: Payload,
}

impl PartialEq for QueuedSend {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for QueuedSend {}

impl PartialOrd for QueuedSend {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for QueuedSend {
    /// The greatest is posted first: the highest priority, then the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then(other.order.cmp(&self.order))
    }
}

impl<T: Transport> Engine<T> {
    /// Posts send `k` of `run` now if the window has room and nothing waits, else queues it.
    pub(super) fn post_or_queue(
        &mut self,
        layout: TagLayout,
        run: Arc<RunState>,
        k: u32,
        payload: Payload,
    ) {
        if self.queue.is_empty() && (self.unbounded || self.sending.window.has_room()) {
            return self.post_send(layout, run, k, payload);
        }
        run.unposted(1);
        self.queue.push(QueuedSend {
            priority: run.graph.sends[k as usize].priority,
            order: self.queued_total,
            layout,
            run,
            k,
            payload,
        });
        self.queued_total += 1;
        self.sending.window.set_queued(self.queue.len());
    }

    /// Posts queued sends, most urgent first, while the window has room (`all`: every one,
    /// when shutting down); then the statuses that waited for them. Returns how many.
    pub(super) fn post_queued(&mut self, all: bool) -> usize {
        let mut posted = 0;
        while all || self.unbounded || self.sending.window.has_room() {
            let Some(q) = self.queue.pop() else {
                break;
            };
            self.sending.window.set_queued(self.queue.len());
            let run = q.run.clone();
            self.post_send(q.layout, q.run, q.k, q.payload);
            posted += 1;
            if run.unposted(-1) == 0 {
                if let Some(i) = self.status_waits.iter().position(|r| Arc::ptr_eq(r, &run)) {
                    let run = self.status_waits.swap_remove(i);
                    self.send_status(run);
                }
            }
            if self.fatal.is_some() {
                break;
            }
        }
        posted
    }

    /// The transport failed: nothing more is posted (the runs are resolved with its error).
    pub(super) fn drop_queue(&mut self) {
        self.queue.clear();
        self.sending.window.set_queued(0);
        self.status_waits.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::run::SendSpec;
    use crate::comm::send::Sending;
    use crate::transport::LocalNetwork;

    fn graph(priorities: &[u32]) -> Arc<CommGraph> {
        let sends = priorities
            .iter()
            .enumerate()
            .map(|(i, &priority)| SendSpec {
                to: 1,
                index: i as u32,
                producer: i as u32,
                priority,
            })
            .collect();
        let g = CommGraph::new(
            "q".into(),
            0,
            crate::plan::Digest {
                graph: 0,
                nodes: vec![],
                relay: 0,
            },
            Arc::from(Vec::new()),
            1,
            priorities.len() as u32,
            sends,
            vec![],
        );
        let _ = g.gid.set(0);
        Arc::new(g)
    }

    #[test]
    fn a_full_window_posts_the_most_urgent_first_then_the_earliest() {
        // Rank 0 of two, a window of one whose send stays in flight (a stalled link); then
        // sends of priority 1, 1, 5 and 3 queue, and go as 5, 3, then the two 1s in order.
        let net = LocalNetwork::new(2);
        net.stall(0, 1);
        let cfg = EngineConfig {
            peer_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(1),
            max_message: 1 << 20,
            stamps: false,
            send_window: 1,
            worker_sends: false,
            worker_polls: false,
            // Tagged messages, so that the order can be read from their tags.
            posted_receives: false,
        };
        let sending = Arc::new(Sending::new(1, 1 << 20));
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut e = Engine::new(net.endpoint(0), cfg, flag, sending.clone());
        let g = graph(&[0, 1, 1, 5, 3]);
        let layout = TagLayout {
            base: 10,
            slots: 1,
            per_run: 5,
        };
        g.publish_layout(layout);
        let run = Arc::new(RunState::new(g.clone(), 0));
        for k in 0..5 {
            e.post_or_queue(layout, run.clone(), k, Payload::Owned(vec![k as u8]));
        }
        assert_eq!(e.queue.len(), 4, "one in flight, four queued");
        assert!(!sending.window.has_room());
        net.release(0, 1);
        // Each release lets the send in flight finish, and the next one goes (and stalls).
        let mut order = Vec::new();
        let mut rx = net.endpoint(1);
        while order.len() < 5 {
            net.stall(0, 1);
            e.poll();
            net.release(0, 1);
            while let Some(m) = rx.probe().unwrap() {
                order.push(layout.decode(m.tag).unwrap().1);
            }
        }
        assert_eq!(order, vec![0, 3, 4, 1, 2]);
        assert_eq!(run.unposted(0), 0);
    }
}

//! A run's result across ranks, peers that leave or die, a failed transport, heartbeats.

use super::*;

impl<T: Transport> Engine<T> {
    pub(super) fn try_resolve(&mut self, gid: u32, seq: u64) {
        let gone = self.gone_error();
        let Some(gs) = self.graphs.get_mut(&gid) else {
            return;
        };
        let Some(run) = gs.active.get(&seq).cloned() else {
            return;
        };
        if !run.is_local_done() {
            return;
        }
        let Some(statuses) = gs.statuses.get(&seq) else {
            return;
        };
        let complete = statuses.iter().all(Option::is_some);
        // Every status in is not enough: a run with no transfers can end everywhere before
        // rank 0's verdict reaches this rank, and a mismatch must not read as success.
        let judged = gs.layout.is_some() || gs.refused.is_some();
        if (!complete || !judged) && gone.is_none() {
            return;
        }
        let failure = statuses
            .iter()
            .flatten()
            .filter_map(|o| match o {
                Outcome::Failed(f) => Some(f),
                _ => None,
            })
            .min_by_key(|f| f.rank);
        let result = match (failure, &gs.refused, complete, gone) {
            (Some(f), _, _, _) => Err(f.to_error()),
            (None, Some(e), _, _) => Err(e.clone()),
            (None, None, true, _) => Ok(()),
            (None, None, false, Some(e)) => Err(e),
            (None, None, false, None) => unreachable!("returned above"),
        };
        run.resolve(result);
        gs.active.remove(&seq);
        gs.statuses.remove(&seq);
    }

    /// The error for runs when some peer is gone (the first gone one).
    pub(super) fn gone_error(&self) -> Option<Error> {
        self.peers
            .iter()
            .enumerate()
            .find_map(|(r, p)| match &p.state {
                PeerState::Alive => None,
                PeerState::Left => Some(
                    Error::new(
                        ErrorKind::PeerLeft,
                        format!("rank {r} shut its runtime down while this run needed it"),
                    )
                    .at_rank(r),
                ),
                PeerState::Dead(why) => Some(
                    Error::new(ErrorKind::PeerDied, format!("rank {r} died: {why}")).at_rank(r),
                ),
            })
    }

    pub(super) fn peer_gone(&mut self, r: usize, state: PeerState) {
        if self.peers[r].state != PeerState::Alive {
            return;
        }
        if matches!(state, PeerState::Dead(_)) {
            self.poison();
        }
        self.peers[r].state = state;
        let e = self.gone_error().expect("a peer is gone");
        let mut pending = Vec::new();
        for (&gid, gs) in &self.graphs {
            for (&seq, run) in &gs.active {
                // A run that has everything from every rank resolves normally.
                let needs = run.recvs.iter().any(|c| c.is_pending())
                    || gs.statuses.get(&seq).is_none_or(|s| s[r].is_none());
                if needs {
                    run.cancel(&e);
                    run.resolve(Err(e.clone()));
                } else {
                    pending.push((gid, seq));
                }
            }
        }
        for (gid, seq) in pending {
            self.try_resolve(gid, seq);
        }
        self.woke = true;
    }

    pub(super) fn transport_failed(&mut self, e: Error) {
        if self.fatal.is_some() {
            return;
        }
        self.fatal = Some(e.clone());
        self.poison();
        for gs in self.graphs.values_mut() {
            for run in gs.active.values() {
                run.cancel(&e);
                run.resolve(Err(e.clone()));
            }
            for (run, _, _) in gs.held.drain(..) {
                run.resolve(Err(e.clone()));
            }
        }
        self.woke = true;
    }

    pub(super) fn poison(&mut self) {
        self.poisoned = true;
        self.poisoned_flag
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Heartbeats out, silent peers declared dead. Cheap to call often.
    pub(crate) fn timers(&mut self) {
        let now = Instant::now();
        if self.closing.is_none() && now.duration_since(self.last_beat) >= self.cfg.heartbeat {
            self.last_beat = now;
            self.broadcast(&Control::Heartbeat);
        }
        if now.duration_since(self.last_check) < Duration::from_millis(10) {
            return;
        }
        self.last_check = now;
        for r in 0..self.size {
            if r == self.rank || self.peers[r].state != PeerState::Alive {
                continue;
            }
            let silent = now.duration_since(self.peers[r].last_heard);
            if silent > self.cfg.peer_timeout {
                self.peer_gone(
                    r,
                    PeerState::Dead(format!(
                        "silent for {:.1} s (killed, or hung; the peer timeout is {:.1} s)",
                        silent.as_secs_f64(),
                        self.cfg.peer_timeout.as_secs_f64()
                    )),
                );
            }
        }
    }
}

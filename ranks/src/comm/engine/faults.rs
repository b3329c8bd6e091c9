//! A run's result across ranks, peers that leave or die, a failed transport, heartbeats.

use super::*;

impl<T: Transport> Engine<T> {
    /// Resolves run `seq` of graph `gid` once it ended here, every rank's status is in and the
    /// graph's verdict too; or earlier, once a status it lacks belongs to a rank that is gone.
    pub(super) fn try_resolve(&mut self, gid: u32, seq: u64) {
        let peers: Vec<bool> = self
            .peers
            .iter()
            .map(|p| p.state == PeerState::Alive)
            .collect();
        let Some(gs) = self.graphs.get(&gid) else {
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
        // A missing status of a gone rank will never come; one of a live rank will.
        let missing_gone = (0..self.size).find(|&r| statuses[r].is_none() && !peers[r]);
        let complete = statuses.iter().all(Option::is_some);
        // Every status in is not enough: a run with no transfers can end everywhere before
        // rank 0's verdict reaches this rank, and a mismatch must not read as success.
        let judged = gs.layout.is_some() || gs.refused.is_some() || !peers[0];
        if missing_gone.is_none() && (!complete || !judged) {
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
        let result = match (failure, &gs.refused, missing_gone) {
            (Some(f), _, _) => Err(f.to_error()),
            (None, Some(e), _) => Err(e.clone()),
            (None, None, Some(r)) => Err(self.gone_error(r).expect("gone")),
            (None, None, None) if judged => Ok(()),
            (None, None, None) => Err(self.gone_error(0).expect("rank 0 is gone")),
        };
        run.resolve(result);
        let gs = self.graphs.get_mut(&gid).expect("present");
        gs.active.remove(&seq);
        gs.statuses.remove(&seq);
    }

    /// The first peer that is gone, if any.
    pub(super) fn first_gone(&self) -> Option<usize> {
        (0..self.size).find(|&r| self.peers[r].state != PeerState::Alive)
    }

    /// The error for a run that needs rank `r`, if `r` is gone.
    pub(super) fn gone_error(&self, r: usize) -> Option<Error> {
        match &self.peers[r].state {
            PeerState::Alive => None,
            PeerState::Left => Some(
                Error::new(
                    ErrorKind::PeerLeft,
                    format!("rank {r} shut its runtime down while this run needed it"),
                )
                .at_rank(r),
            ),
            PeerState::Dead(why) => {
                Some(Error::new(ErrorKind::PeerDied, format!("rank {r} died: {why}")).at_rank(r))
            }
        }
    }

    /// Rank `r` left or died: every run that still needs it (its status is not in: a rank's
    /// status follows all it sends for the run, and its `Bye` follows its statuses) fails with
    /// an error naming it; the others resolve as usual.
    pub(super) fn peer_gone(&mut self, r: usize, state: PeerState) {
        if self.peers[r].state != PeerState::Alive {
            return;
        }
        // Sends to it must be dropped, which only this thread does.
        self.sending.stop_direct();
        if matches!(state, PeerState::Dead(_)) {
            self.poison();
        }
        self.peers[r].state = state;
        let e = self.gone_error(r).expect("just gone");
        let mut resolvable = Vec::new();
        for (&gid, gs) in &self.graphs {
            for (&seq, run) in &gs.active {
                let needs = gs.statuses.get(&seq).is_none_or(|s| s[r].is_none());
                if needs {
                    run.cancel(&e);
                    run.resolve(Err(e.clone()));
                } else {
                    resolvable.push((gid, seq));
                }
            }
        }
        for (gid, seq) in resolvable {
            self.try_resolve(gid, seq);
        }
        // Its sends in flight may never finish and keep their places in the window.
        self.unbounded = true;
        self.post_queued(true);
    }

    pub(super) fn transport_failed(&mut self, e: Error) {
        if self.fatal.is_some() {
            return;
        }
        self.fatal = Some(e.clone());
        self.sending.stop_direct();
        self.drop_queue();
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

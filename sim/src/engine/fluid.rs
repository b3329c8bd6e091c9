//! A shared resource in the fluid model: a host's cores, a GPU's SMs. Each running action
//! has work left (seconds at full speed) and a [`Demand`]: the share of the resource it uses
//! at full speed (1 core; a kernel's occupancy of the GPU), its interference and its level.
//! On a prioritized resource capacity goes to the high level first; within a level (or on a
//! resource without levels, as the GPU presets are), when the demands exceed what is left,
//! every action slows by the same factor (its share is its demand scaled down). So kernels
//! that together fit in the GPU run side by side at full speed, and past that share it in
//! proportion to their demand, the way the block scheduler spreads their blocks over free
//! SMs. An action with interference above 1 progresses that much slower while any other
//! action shares the resource with it.

/// Who an action belongs to (what its completion wakes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A worker's body (host cores).
    Worker(u32),
    /// A task's kernel (a GPU).
    Kernel(u32),
    /// An idle worker watching the queues (`spin_loop` hints: a core's worth of work).
    Spin(u32),
    /// A rank's communication thread's job (a send's or an arrival's work, with its copy).
    Comm(u32),
}

/// What an action asks of its resource.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Demand {
    /// The share of the resource it uses at full speed (1: a core; a kernel's occupancy).
    pub(crate) share: f64,
    /// How much slower it progresses while another action shares the resource (at least 1).
    pub(crate) interference: f64,
    /// Served first on a prioritized resource.
    pub(crate) high: bool,
}

impl Demand {
    /// A thread's work on a core.
    pub(crate) const CORE: Demand = Demand {
        share: 1.0,
        interference: 1.0,
        high: false,
    };
}

#[derive(Clone, Debug)]
struct Action {
    owner: Owner,
    left: f64,
    demand: Demand,
    speed: f64,
}

/// One resource.
#[derive(Debug)]
pub(crate) struct Fluid {
    capacity: f64,
    prioritized: bool,
    actions: Vec<Action>,
    last: f64,
    /// Bumped at every change: a scheduled completion check of an older version is stale.
    pub(crate) version: u64,
    /// ∫ (capacity in use) dt and ∫ [any action running] dt, for the busy fractions.
    pub(crate) used: f64,
    pub(crate) active: f64,
}

impl Fluid {
    pub(crate) fn new(capacity: f64, prioritized: bool) -> Self {
        Fluid {
            capacity,
            prioritized,
            actions: Vec::new(),
            last: 0.0,
            version: 0,
            used: 0.0,
            active: 0.0,
        }
    }

    /// Brings every action's work left to `now`.
    fn advance(&mut self, now: f64) {
        let dt = now - self.last;
        if dt > 0.0 {
            let mut in_use = 0.0;
            for a in &mut self.actions {
                a.left -= a.speed * dt;
                in_use += a.speed * a.demand.share * a.demand.interference;
            }
            self.used += in_use.min(self.capacity) * dt;
            if !self.actions.is_empty() {
                self.active += dt;
            }
        }
        self.last = now;
    }

    fn share(&mut self) {
        let mut cap = self.capacity;
        for level in [true, false] {
            let demand: f64 = self
                .actions
                .iter()
                .filter(|a| !self.prioritized || a.demand.high == level)
                .map(|a| a.demand.share)
                .sum();
            let speed = if demand <= cap {
                1.0
            } else if cap > 0.0 {
                cap / demand
            } else {
                0.0
            };
            for a in &mut self.actions {
                if !self.prioritized || a.demand.high == level {
                    a.speed = speed;
                }
            }
            cap -= demand.min(cap);
            if !self.prioritized {
                break;
            }
        }
        if self.actions.len() > 1 {
            for a in &mut self.actions {
                a.speed /= a.demand.interference;
            }
        }
    }

    /// When the next action ends (`None`: none running).
    fn next_end(&self, now: f64) -> Option<f64> {
        self.actions
            .iter()
            .filter(|a| a.speed > 0.0 && a.left.is_finite())
            .map(|a| now + (a.left / a.speed).max(0.0))
            .min_by(f64::total_cmp)
    }

    /// Starts an action; returns the time of the next completion check to schedule.
    pub(crate) fn add(&mut self, now: f64, owner: Owner, work: f64, demand: Demand) -> Option<f64> {
        self.advance(now);
        self.actions.push(Action {
            owner,
            left: work.max(0.0),
            demand,
            speed: 1.0,
        });
        self.share();
        self.version += 1;
        self.next_end(now)
    }

    /// Takes `owner`'s action out (a spin that ended); returns the next check to schedule.
    pub(crate) fn remove(&mut self, now: f64, owner: Owner) -> Option<f64> {
        self.advance(now);
        self.actions.retain(|a| a.owner != owner);
        self.share();
        self.version += 1;
        self.next_end(now)
    }

    /// The actions done at `now` (removed), and the next check to schedule.
    pub(crate) fn finish(&mut self, now: f64, done: &mut Vec<Owner>) -> Option<f64> {
        self.advance(now);
        // A relative tolerance: the check was scheduled at the computed end.
        self.actions.retain(|a| {
            let over = a.left <= 1e-12;
            if over {
                done.push(a.owner);
            }
            !over
        });
        self.share();
        self.version += 1;
        self.next_end(now)
    }

    /// Brings the accounting to the end of the run.
    pub(crate) fn close(&mut self, now: f64) {
        self.advance(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(share: f64, high: bool) -> Demand {
        Demand {
            share,
            interference: 1.0,
            high,
        }
    }

    #[test]
    fn kernels_that_fit_run_side_by_side_and_past_that_slow_down() {
        let mut g = Fluid::new(1.0, true);
        // Two kernels of half the GPU: both at full speed.
        g.add(0.0, Owner::Kernel(0), 1.0, kernel(0.5, false));
        let next = g
            .add(0.0, Owner::Kernel(1), 2.0, kernel(0.5, false))
            .unwrap();
        assert_eq!(next, 1.0);
        // A third at t = 0.5 overbooks: all three at 1/1.5 speed.
        let next = g
            .add(0.5, Owner::Kernel(2), 1.0, kernel(0.5, false))
            .unwrap();
        // Kernel 0 has 0.5 left at speed 2/3: ends at 0.5 + 0.75.
        assert!((next - 1.25).abs() < 1e-12, "{next}");
        let mut done = Vec::new();
        g.finish(next, &mut done);
        assert_eq!(done, vec![Owner::Kernel(0)]);
    }

    #[test]
    fn the_high_level_takes_its_share_first() {
        let mut g = Fluid::new(1.0, true);
        g.add(0.0, Owner::Kernel(0), 1.0, kernel(1.0, false));
        let next = g
            .add(0.0, Owner::Kernel(1), 1.0, kernel(0.75, true))
            .unwrap();
        // High at full speed; low gets the quarter left: speed 0.25.
        assert_eq!(next, 1.0);
        let mut done = Vec::new();
        let next = g.finish(1.0, &mut done).unwrap();
        assert_eq!(done, vec![Owner::Kernel(1)]);
        // Low had 0.75 left, now alone at full speed.
        assert!((next - 1.75).abs() < 1e-12, "{next}");
        // Fair sharing without priorities.
        let mut f = Fluid::new(1.0, false);
        f.add(0.0, Owner::Kernel(0), 1.0, kernel(1.0, false));
        assert_eq!(
            f.add(0.0, Owner::Kernel(1), 1.0, kernel(1.0, true)),
            Some(2.0)
        );
    }

    #[test]
    fn interference_slows_shared_kernels_only() {
        let mut g = Fluid::new(1.0, false);
        let slow = Demand {
            interference: 1.25,
            ..kernel(0.5, false)
        };
        // Alone: full speed.
        assert_eq!(g.add(0.0, Owner::Kernel(0), 1.0, slow), Some(1.0));
        // With another half-GPU kernel: both fit, but the first runs at 1 / 1.25.
        let next = g
            .add(0.5, Owner::Kernel(1), 1.0, kernel(0.5, false))
            .unwrap();
        assert!((next - 1.125).abs() < 1e-12, "{next}");
        let mut done = Vec::new();
        let next = g.finish(next, &mut done).unwrap();
        assert_eq!(done, vec![Owner::Kernel(0)]);
        // Kernel 1 had 0.375 left, alone again at full speed.
        assert!((next - 1.5).abs() < 1e-12, "{next}");
    }

    #[test]
    fn cores_are_shared_past_their_count() {
        let mut h = Fluid::new(2.0, false);
        for w in 0..4 {
            h.add(0.0, Owner::Worker(w), 1.0, Demand::CORE);
        }
        let mut done = Vec::new();
        assert_eq!(h.finish(2.0, &mut done), None);
        assert_eq!(done.len(), 4);
        h.close(3.0);
        assert!((h.used - 4.0).abs() < 1e-12);
        assert!((h.active - 2.0).abs() < 1e-12);
    }
}

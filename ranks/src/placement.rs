//! Where a rank's threads run (a leaf): its workers' cores and its communication thread's,
//! chosen from the cores this process may use and the launcher's local rank and size, and how
//! they wait when idle, which depends on whether every thread has a core of its own.

use std::fmt;
use std::time::Duration;

/// The communication thread's spin (with work in flight) and the workers' idle spin where every
/// thread of the node's ranks has a core of its own: a hand-off then costs a look at memory,
/// not a wake-up, as raw MPI's spinning processes pay.
pub(crate) const SPIN_WITH_SPARE_CORES: Duration = Duration::from_micros(100);

/// Where a rank's threads run and how they wait, as the runtime set them up
/// ([`Ranks::placement`](crate::Ranks::placement)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Placement {
    /// Each worker's core (`None`: unpinned).
    pub workers: Vec<Option<usize>>,
    /// The communication thread's core (`None`: unpinned).
    pub comm: Option<usize>,
    /// This process's position among the ranks of its node and their number, as the launcher
    /// said (`None`: it did not, or it bound this process to cores of its own).
    pub local: Option<(usize, usize)>,
    /// The cores this process may use.
    pub cores: usize,
    /// Whether every worker and communication thread of the node's ranks has a core of its own.
    pub spare_cores: bool,
    /// How long the communication thread spins, with work in flight and nothing to do,
    /// before it yields (then parks).
    pub comm_spin: Duration,
    /// How long a worker that ran dry watches the queues before it parks (`None`: the pool's
    /// own setting, for a rank over a pool made elsewhere).
    pub idle_spin: Option<Duration>,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = |c: &Option<usize>| c.map_or("unpinned".to_string(), |c| c.to_string());
        let workers: Vec<String> = self.workers.iter().map(core).collect();
        write!(
            f,
            "workers on cores [{}], communication thread on {}; ",
            workers.join(", "),
            core(&self.comm)
        )?;
        match self.local {
            Some((r, n)) => write!(f, "local rank {r} of {n}, ")?,
            None => f.write_str("no local rank, ")?,
        }
        write!(
            f,
            "{} core(s) available{}; communication thread spins {} µs, workers {}",
            self.cores,
            if self.spare_cores {
                ", a core per thread"
            } else {
                ", threads share cores"
            },
            self.comm_spin.as_micros(),
            self.idle_spin
                .map_or("the pool's default".to_string(), |d| format!(
                    "{} µs",
                    d.as_micros()
                ))
        )
    }
}

/// The cores of `workers` workers and of the communication thread of local rank `r` of `n`
/// (`local`), from the cores this process may use (`allowed`, in order), and whether each
/// thread of the `n` ranks gets a core of its own.
///
/// With enough cores for every thread of every local rank, rank `r` takes the `r`-th of `n`
/// equal shares of `allowed`: its workers on the share's first cores, its communication thread
/// on the next. Otherwise the workers of the local ranks are dealt round-robin over `allowed`
/// (rank `r`'s worker `j` on `allowed[(r × workers + j) mod len]`, so that two ranks' workers
/// do not both start at the first core) and the communication thread is not pinned.
pub(crate) fn plan(
    allowed: &[usize],
    local: Option<(usize, usize)>,
    workers: usize,
) -> (Vec<Option<usize>>, Option<usize>, bool) {
    if allowed.is_empty() {
        return (vec![None; workers], None, false);
    }
    let (n, r) = match local {
        Some((r, n)) if n > 0 => (n, r % n),
        _ => (1, 0),
    };
    let len = allowed.len();
    if len >= n * (workers + 1) {
        let share = len / n;
        let base = r * share;
        let cores = (0..workers).map(|j| Some(allowed[base + j])).collect();
        return (cores, Some(allowed[base + workers]), true);
    }
    let cores = (0..workers)
        .map(|j| Some(allowed[(r * workers + j) % len]))
        .collect();
    (cores, None, false)
}

/// The number of CPUs online (Linux: `/sys/devices/system/cpu/online`, as "0-15,32-47"), or
/// `None` where that cannot be read.
pub(crate) fn cpus_online() -> Option<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let mut n = 0;
    for part in s.trim().split(',') {
        let mut ends = part.split('-').map(|x| x.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(_)), None) => n += 1,
            (Some(Ok(a)), Some(Ok(b))) if b >= a => n += b - a + 1,
            _ => return None,
        }
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enough_cores_give_each_local_rank_a_share() {
        let allowed: Vec<usize> = (0..16).collect();
        assert_eq!(
            plan(&allowed, Some((0, 2)), 2),
            (vec![Some(0), Some(1)], Some(2), true)
        );
        assert_eq!(
            plan(&allowed, Some((1, 2)), 2),
            (vec![Some(8), Some(9)], Some(10), true)
        );
        assert_eq!(
            plan(&allowed, Some((3, 4)), 3),
            (vec![Some(12), Some(13), Some(14)], Some(15), true)
        );
        assert!(plan(&allowed, None, 15).2);
        assert!(!plan(&allowed, None, 16).2);
    }

    #[test]
    fn too_few_cores_deal_the_workers_round_robin() {
        // 2 cores, 2 ranks of 1 worker: one worker per core, the comm threads unpinned.
        assert_eq!(plan(&[0, 1], Some((0, 2)), 1), (vec![Some(0)], None, false));
        assert_eq!(plan(&[0, 1], Some((1, 2)), 1), (vec![Some(1)], None, false));
        assert_eq!(
            plan(&[4, 5, 6], Some((1, 2)), 2),
            (vec![Some(6), Some(4)], None, false)
        );
        assert_eq!(plan(&[], Some((1, 2)), 2), (vec![None, None], None, false));
    }

    #[test]
    fn online_cpus_are_counted() {
        if let Some(n) = cpus_online() {
            assert!(n >= 1);
        }
    }
}

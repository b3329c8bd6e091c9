//! Placement of threads outside the pool: a server's request threads kept off the cores the
//! pool's workers are pinned to, so that a worker never waits behind one of them for its core
//! (what made a latency-critical graph's tail beside many client threads).

use std::io;

use crate::error::{bounded_list, Error, ErrorKind};

/// Pins the calling thread to `cores`; threads it starts afterwards inherit the set. With
/// [`Pool::keep_off_workers`](crate::Pool::keep_off_workers) for the rest of a server's
/// threads, e.g. a latency-critical request thread on a core of its own
/// ([`Pool::reserve_core`](crate::Pool::reserve_core)) and the other request threads on the
/// rest.
///
/// An [`ErrorKind::Placement`] error naming the cores where the set is empty, or the OS
/// refuses (`source()`: a core this process may not use, or a platform other than Linux).
pub fn pin_current_thread(cores: &[usize]) -> Result<(), Error> {
    let named = || bounded_list(cores, cores.len(), ", ");
    if cores.is_empty() {
        return Err(Error::new(
            ErrorKind::Placement,
            "cannot pin the calling thread to an empty set of cores",
        ));
    }
    pin_current(cores).map_err(|e| {
        Error::new(
            ErrorKind::Placement,
            format!(
                "the OS refused to pin the calling thread to cores [{}]",
                named()
            ),
        )
        .with_source(Box::new(e))
    })
}

/// The cores the calling thread may run on (`None` where the platform cannot tell).
pub(crate) fn allowed_cores() -> Option<Vec<usize>> {
    core_affinity::get_core_ids().map(|ids| ids.into_iter().map(|c| c.id).collect())
}

/// `allowed` less `taken`, in `allowed`'s order.
pub(crate) fn free_cores(allowed: &[usize], taken: &[usize]) -> Vec<usize> {
    allowed
        .iter()
        .copied()
        .filter(|c| !taken.contains(c))
        .collect()
}

/// Pins the calling thread to `cores` (threads it starts afterwards inherit the set).
#[cfg(target_os = "linux")]
pub(crate) fn pin_current(cores: &[usize]) -> io::Result<()> {
    let limit = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if let Some(&c) = cores.iter().find(|&&c| c >= limit) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("core {c} is past the {limit} cores a cpu_set_t holds"),
        ));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes a bit inside it (every
    // core is below `limit`, checked above); sched_setaffinity reads it for the calling
    // thread (pid 0).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cores {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn pin_current(_cores: &[usize]) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "placing a thread on a set of cores is implemented on Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_cores_keeps_the_order_and_drops_the_taken() {
        assert_eq!(free_cores(&[3, 0, 1, 2], &[1, 3]), vec![0, 2]);
        assert_eq!(free_cores(&[0, 1], &[0, 1]), Vec::<usize>::new());
        assert_eq!(free_cores(&[0, 1], &[]), vec![0, 1]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_pinned_to_a_set_stays_in_it_and_its_children_inherit_it() {
        let Some(allowed) = allowed_cores().filter(|a| !a.is_empty()) else {
            return;
        };
        let one = allowed[allowed.len() - 1];
        std::thread::spawn(move || {
            pin_current(&[one]).unwrap();
            assert_eq!(allowed_cores(), Some(vec![one]));
            let child = std::thread::spawn(allowed_cores).join().unwrap();
            assert_eq!(
                child,
                Some(vec![one]),
                "a thread started after inherits the set"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_empty_set_is_refused() {
        let e = pin_current_thread(&[]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Placement);
        assert!(e.to_string().contains("empty set"), "{e}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_core_past_the_set_is_refused_by_name() {
        let e = std::thread::spawn(|| pin_current(&[1 << 20]))
            .join()
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("core 1048576"), "{e}");
    }
}

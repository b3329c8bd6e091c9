//! The NCCL library, a communicator's id, and a device's communicator (an owner the device's
//! table holds). Below `device.rs`: only the driver wrappers and cudarc's `nccl::result` here.

use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{result as nr, sys as ns};

use crate::driver::StreamRef;
use crate::error::{GpuError, GpuErrorKind, GpuResult};

/// The file names cudarc tries for libnccl, in its order.
fn names_tried() -> Vec<String> {
    cudarc::get_lib_name_candidates("nccl")
}

/// Whether libnccl can be loaded (tried once per process): checked before any NCCL call, since
/// cudarc's bindings panic without it.
pub(crate) fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library by cudarc's candidate names.
    *PRESENT.get_or_init(|| unsafe { ns::is_culib_present() })
}

/// The error of a missing libnccl: `what` failed, the names tried, and where the usual
/// packages put the library under another name.
pub(crate) fn missing_error(what: &str, tried: &[String]) -> GpuError {
    GpuError::new(
        GpuErrorKind::LibraryMissing,
        format!(
            "{what}: NCCL (libnccl) could not be loaded: the dynamic loader found none of {} \
             (cudarc's names). Debian's libnccl2 and PyPI's nvidia-nccl-cu* packages ship \
             libnccl.so.2 only: link it as libnccl.so in a folder on LD_LIBRARY_PATH (`ln -s \
             /path/to/libnccl.so.2 DIR/libnccl.so`), or install the development package \
             (libnccl-dev), which has libnccl.so",
            tried.join(", ")
        ),
    )
}

/// `Ok` when libnccl can be loaded; else a [`GpuErrorKind::LibraryMissing`] error naming the
/// file names tried (and what to do about Debian's and PyPI's `libnccl.so.2`). A GPU pool
/// built with [`GpuPoolBuilder::nccl`](crate::GpuPoolBuilder::nccl) checks this first.
pub fn nccl_library_check() -> GpuResult<()> {
    if present() {
        Ok(())
    } else {
        Err(missing_error("NCCL", &names_tried()))
    }
}

/// The check as `build` reports it.
pub(crate) fn check_library(what: &str) -> GpuResult<()> {
    if present() {
        Ok(())
    } else {
        Err(missing_error(what, &names_tried()))
    }
}

/// An NCCL status other than success as a [`GpuErrorKind::Library`] error naming `what` and
/// the call.
pub(crate) fn nccl_error(call: &'static str, e: nr::NcclError, what: &str) -> GpuError {
    crate::libs::status_error(call, format!("{:?}", e.0), what)
}

/// A communicator's unique id (`ncclGetUniqueId`, 128 bytes): made by one rank and sent to
/// the others (over MPI, or the ranks' transport), who make their communicator with it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId([u8; 128]);

impl fmt::Debug for NcclId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclId({:02x?}..)", &self.0[..8])
    }
}

impl NcclId {
    /// A new id (`ncclGetUniqueId`; needs libnccl, not a GPU). An error naming the files tried
    /// when libnccl is missing.
    pub fn new() -> GpuResult<Self> {
        check_library("ncclGetUniqueId")?;
        let id = nr::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e, "NCCL"))?;
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }

    /// Its 128 bytes, to send.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.0
    }

    /// The id whose bytes another rank sent (an error unless exactly 128 bytes).
    pub fn from_bytes(bytes: &[u8]) -> GpuResult<Self> {
        let b: [u8; 128] = bytes.try_into().map_err(|_| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("an NCCL id is 128 bytes, not {}", bytes.len()),
            )
        })?;
        Ok(NcclId(b))
    }

    fn raw(&self) -> ns::ncclUniqueId {
        ns::ncclUniqueId {
            internal: self.0.map(|b| b as ::core::ffi::c_char),
        }
    }
}

/// A device's communicator and the stream its operations run on: an owner, held by the
/// device's table and aborted by consuming it ([`abort`](Self::abort)) on the device's last
/// worker.
pub(crate) struct DeviceComm {
    comm: ns::ncclComm_t,
    /// The communicator's stream (cudarc's; also registered with the device, so that a free
    /// fences it and its teardown drops it).
    _stream: Arc<CudaStream>,
    pub(crate) stream: StreamRef,
    pub(crate) rank: usize,
    pub(crate) world: usize,
}

// SAFETY: an NCCL communicator may be used from any thread whose current device is its own
// (every user is a bound worker of the device), one thread at a time: the device's table keeps
// it under a lock, and it is consumed (aborted) once.
unsafe impl Send for DeviceComm {}

impl DeviceComm {
    /// Joins the communicator of `id` as `rank` of `world` (`ncclCommInitRank`: blocks until
    /// every rank has joined), with a new stream of `cuda` for its operations, which
    /// `register` records with the device. Runs on a bound worker of the device: NCCL takes
    /// the device from the current context.
    pub(crate) fn init(
        cuda: &Arc<CudaContext>,
        register: impl FnOnce(Arc<CudaStream>) -> StreamRef,
        id: &NcclId,
        (rank, world): (usize, usize),
        what: &str,
    ) -> GpuResult<Self> {
        check_library(what)?;
        let bad = || {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("{what}: NCCL rank {rank} of {world} ranks"),
            )
        };
        let (Ok(world_c), Ok(rank_c)) = (i32::try_from(world), i32::try_from(rank)) else {
            return Err(bad());
        };
        if rank >= world {
            return Err(bad());
        }
        let stream = cuda
            .new_stream()
            .map_err(|e| GpuError::driver("cuStreamCreate", what, e))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: an out-pointer for one communicator, written on success only; the id is
        // 128 bytes by value; the device is the current context's (a bound worker).
        unsafe { nr::comm_init_rank(comm.as_mut_ptr(), world_c, id.raw(), rank_c) }
            .map_err(|e| nccl_error("ncclCommInitRank", e, what))?;
        // SAFETY: written by the successful call above.
        let comm = unsafe { comm.assume_init() };
        let view = register(stream.clone());
        Ok(DeviceComm {
            comm,
            _stream: stream,
            stream: view,
            rank,
            world,
        })
    }

    /// The raw communicator, for one operation under the device's lock.
    pub(crate) fn raw(&self) -> ns::ncclComm_t {
        self.comm
    }

    /// Aborts the communicator (`ncclCommAbort`: local, returns at once, whatever the peers
    /// do; after the device's work has finished there is nothing to abort but the handle).
    pub(crate) fn abort(self) {
        // SAFETY: a live communicator, consumed here: aborted once.
        let _ = unsafe { nr::comm_abort(self.comm) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_libnccl_names_the_files_tried_and_the_usual_packages() {
        let tried = names_tried();
        for name in ["libnccl.so", "libnccl.so.13", "libnccl.so.12"] {
            assert!(tried.iter().any(|t| t == name), "{name} in {tried:?}");
        }
        let e = missing_error("building the GPU pool", &tried);
        assert_eq!(e.kind(), GpuErrorKind::LibraryMissing);
        let m = e.message();
        assert!(
            m.starts_with("building the GPU pool: NCCL (libnccl)"),
            "{m}"
        );
        assert!(m.contains("libnccl.so, "), "{m}");
        assert!(m.contains("libnccl.so.13"), "{m}");
        assert!(m.contains("libnccl.so.12"), "{m}");
        assert!(m.contains("libnccl.so.2 only"), "{m}");
    }

    #[test]
    fn the_check_agrees_with_the_loader() {
        // Here (no NCCL) the check fails naming the files; where NCCL is installed it passes.
        match nccl_library_check() {
            Ok(()) => assert!(present()),
            Err(e) => {
                assert!(!present());
                assert_eq!(e.kind(), GpuErrorKind::LibraryMissing);
                assert!(e.message().contains("libnccl.so.12"), "{e}");
                let id = NcclId::new().unwrap_err();
                assert!(id.message().starts_with("ncclGetUniqueId: NCCL"), "{id}");
            }
        }
    }

    #[test]
    fn ids_round_trip_through_bytes() {
        let mut b = [0u8; 128];
        b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
        let id = NcclId::from_bytes(&b).unwrap();
        assert_eq!(id.as_bytes(), &b);
        let back = NcclId::from_bytes(id.raw().internal.map(|c| c as u8).as_slice()).unwrap();
        assert_eq!(back, id);
        let e = NcclId::from_bytes(&b[..100]).unwrap_err();
        assert!(e.message().contains("128 bytes, not 100"), "{e}");
    }
}

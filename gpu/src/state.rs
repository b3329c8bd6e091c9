//! Per-worker user state ([`GpuPoolBuilder::worker_state`](crate::GpuPoolBuilder::worker_state)),
//! and the plan of what every device worker sets up at start (libraries, states).

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

use boundpool_scheduler::{BoxError, WorkerInfo};
use cudarc::driver::CudaContext;

use crate::device::DeviceInfo;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::libs::Library;

/// What a [`GpuPoolBuilder::worker_state`](crate::GpuPoolBuilder::worker_state) factory is
/// given: the worker it runs on (already bound to its device's context) and its device.
#[derive(Debug)]
pub struct WorkerSetup<'a> {
    worker: &'a WorkerInfo,
    device: &'a DeviceInfo,
    context: &'a Arc<CudaContext>,
}

impl<'a> WorkerSetup<'a> {
    /// What `worker`, a worker of `device` bound to `context`, gives its state factories.
    pub(crate) fn new(
        worker: &'a WorkerInfo,
        device: &'a DeviceInfo,
        context: &'a Arc<CudaContext>,
    ) -> Self {
        Self {
            worker,
            device,
            context,
        }
    }
}

impl WorkerSetup<'_> {
    /// The worker (name, index, group).
    pub fn worker(&self) -> &WorkerInfo {
        self.worker
    }
    /// The device's context as cudarc's type, bound to this worker: load a cudarc module here
    /// (`context().load_module(ptx)`) to keep one per worker in its state.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.context
    }
    /// The worker's device.
    pub fn device(&self) -> &DeviceInfo {
        self.device
    }
}

type MakeState = dyn Fn(&WorkerSetup<'_>) -> Result<Box<dyn Any + Send>, BoxError> + Send + Sync;

/// One registered state factory.
#[derive(Clone)]
pub(crate) struct StateMaker {
    type_id: TypeId,
    type_name: &'static str,
    make: Arc<MakeState>,
}

impl fmt::Debug for StateMaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.type_name)
    }
}

impl StateMaker {
    pub(crate) fn new<T, F>(f: F) -> Self
    where
        T: Send + 'static,
        F: Fn(&WorkerSetup<'_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        Self {
            type_id: TypeId::of::<T>(),
            type_name: std::any::type_name::<T>(),
            make: Arc::new(move |s| f(s).map(|v| Box::new(v) as Box<dyn Any + Send>)),
        }
    }

    pub(crate) fn state_type(&self) -> TypeId {
        self.type_id
    }
}

/// What every device worker sets up at start, besides its stream.
#[derive(Clone, Debug, Default)]
pub(crate) struct WorkerPlan {
    pub(crate) blas: bool,
    pub(crate) solver: bool,
    pub(crate) states: Vec<StateMaker>,
}

impl WorkerPlan {
    /// Build-time check: a library asked for up front must be loadable.
    pub(crate) fn check_libraries(&self) -> GpuResult<()> {
        for (on, lib) in [(self.blas, Library::Blas), (self.solver, Library::Solver)] {
            if on && !lib.present() {
                return Err(lib.missing_error("building the GPU pool"));
            }
        }
        Ok(())
    }
}

/// A device worker's user states, created and dropped on it.
#[derive(Default)]
pub(crate) struct WorkerStates {
    values: Vec<(TypeId, Box<dyn Any + Send>)>,
}

impl WorkerStates {
    /// Makes the states of `makers` on this worker, in order; a factory's error names the
    /// worker (`what`) and the state's type.
    pub(crate) fn make(
        &mut self,
        makers: &[StateMaker],
        setup: &WorkerSetup<'_>,
        what: &dyn Fn() -> String,
    ) -> GpuResult<()> {
        for m in makers {
            let v = (m.make)(setup).map_err(|e| {
                GpuError::new(
                    GpuErrorKind::WorkerState,
                    format!("{}: worker state {}: {e}", what(), m.type_name),
                )
                .with_source(e)
            })?;
            self.values.push((m.type_id, v));
        }
        Ok(())
    }

    pub(crate) fn get<T: 'static>(&self) -> Option<&T> {
        self.values
            .iter()
            .find(|(t, _)| *t == TypeId::of::<T>())
            .and_then(|(_, v)| v.downcast_ref::<T>())
    }

    /// Drops the states, last created first, on the worker (its context still current).
    pub(crate) fn drop_all(mut self) {
        while let Some(v) = self.values.pop() {
            drop(v);
        }
    }
}

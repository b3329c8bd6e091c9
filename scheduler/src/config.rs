//! Pool settings shared by the builder and the workers, a leaf module (as tokio keeps its
//! `config.rs`): cores, groups, who a worker is, the shutdown mode, and the hooks' types.

use std::sync::Arc;

use crate::error::BoxError;
use crate::ids::GroupId;

/// Which cores workers are pinned to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Cores {
    /// Every core this process may run on (its affinity mask), one worker per core in turn.
    #[default]
    All,
    /// These core ids, one worker per core in turn. Each must be in the process's affinity mask.
    List(Vec<usize>),
    /// Do not pin.
    Unpinned,
}

/// A group of workers: a name, how many, and their cores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    /// The group's name (in errors, thread names and metrics).
    pub name: String,
    /// Number of workers; at least one.
    pub workers: usize,
    /// Their cores.
    pub cores: Cores,
}

impl GroupSpec {
    /// A group named `name` of `workers` workers on [`Cores::All`].
    pub fn new(name: impl Into<String>, workers: usize) -> Self {
        GroupSpec {
            name: name.into(),
            workers,
            cores: Cores::All,
        }
    }

    /// Sets the group's cores.
    pub fn cores(mut self, cores: Cores) -> Self {
        self.cores = cores;
        self
    }
}

/// Who a worker is: passed to hooks, available to nodes through
/// [`NodeCtx::worker_info`](crate::NodeCtx::worker_info).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Position among all the pool's workers.
    pub index: usize,
    /// Its group.
    pub group: GroupId,
    /// Its group's name.
    pub group_name: String,
    /// Position within its group.
    pub index_in_group: usize,
    /// The core it is pinned to (`None`: unpinned).
    pub core: Option<usize>,
    /// Its thread's name.
    pub name: String,
}

/// How [`Pool::shutdown`](crate::Pool::shutdown) treats graphs still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ShutdownMode {
    /// Let every submitted graph finish (what dropping the pool does).
    #[default]
    Finish,
    /// Fail every submitted graph with [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled): nodes already running finish,
    /// nodes not started never run.
    Cancel,
}

pub(crate) type StartHook<S> = Arc<dyn Fn(&WorkerInfo) -> Result<S, BoxError> + Send + Sync>;
pub(crate) type StopHook<S> = Arc<dyn Fn(&WorkerInfo, S) + Send + Sync>;
pub(crate) type IdleHook<S> = Arc<dyn Fn(&WorkerInfo, &S) + Send + Sync>;
pub(crate) type SpinHook<S> = Arc<dyn Fn(&WorkerInfo, &S) -> bool + Send + Sync>;
pub(crate) type NameFn = Arc<dyn Fn(&WorkerInfo) -> String + Send + Sync>;

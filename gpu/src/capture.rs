//! A replay capture in progress on a worker, as the node path sees it: the capturing stream,
//! the worker's own stream for what is hoisted out of the capture, the first operation refused
//! and the staging buffers. The replay's capture (`replay/`) makes one per segment and takes
//! back what it kept; `GpuCtx` (`node/mod.rs`, which also holds the methods that enqueue for it)
//! consults it to hoist allocations, stage host copies and refuse what a CUDA graph cannot hold.

use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::buffer::DeviceBuffer;
use crate::driver::StreamRef;

/// A capture in progress on a worker: what `GpuCtx` needs to hoist allocations, stage host
/// copies and refuse what cannot be captured.
pub(crate) struct Capture {
    /// The worker's own stream, not capturing: hoisted allocations and staging copies go there.
    side: StreamRef,
    /// The capturing stream, as cudarc's type (`GpuCtx::stream`).
    stream: Arc<CudaStream>,
    /// Why the capture cannot go on (the first operation refused).
    refused: RefCell<Option<String>>,
    /// Staging buffers of captured host-to-device copies (kept with the segment).
    staged: RefCell<Vec<DeviceBuffer<u8>>>,
    /// Values the bodies read from outside the capture (kept with the segment: the graph may
    /// hold device addresses of buffers in them).
    held: RefCell<Vec<Arc<dyn Any + Send + Sync>>>,
}

impl Capture {
    /// A capture on `stream` by a worker whose own stream is `side`.
    pub(crate) fn new(side: StreamRef, stream: Arc<CudaStream>) -> Self {
        Self {
            side,
            stream,
            refused: RefCell::new(None),
            staged: RefCell::new(Vec::new()),
            held: RefCell::new(Vec::new()),
        }
    }

    /// Keeps a hoisted buffer (a library workspace) as long as the segment's executable.
    pub(crate) fn keep(&self, buf: DeviceBuffer<u8>) {
        self.staged.borrow_mut().push(buf);
    }

    /// Keeps a value a body read from outside the capture as long as the segment's
    /// executable (the graph may hold addresses of device buffers in it).
    pub(crate) fn hold(&self, v: Arc<dyn Any + Send + Sync>) {
        self.held.borrow_mut().push(v);
    }

    /// The capturing stream.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The worker's own stream, not capturing.
    pub(crate) fn side(&self) -> StreamRef {
        self.side
    }

    /// Remembers why the capture cannot go on (the first reason only: the capture fails with
    /// it even if the body swallows the error).
    pub(crate) fn note_refused(&self, msg: &str) {
        self.refused
            .borrow_mut()
            .get_or_insert_with(|| msg.to_owned());
    }

    /// Why the capture cannot go on, if an operation was refused (taken).
    pub(crate) fn take_refused(&self) -> Option<String> {
        self.refused.borrow_mut().take()
    }

    /// What the segment keeps from now on: the staging and hoisted buffers, and the values
    /// held.
    pub(crate) fn into_kept(self) -> Kept {
        Kept {
            _staged: self.staged.into_inner(),
            _held: self.held.into_inner(),
        }
    }
}

/// What a segment keeps as long as its executable: buffers its capture hoisted or staged, and
/// values its bodies read from outside it.
#[derive(Default)]
pub(crate) struct Kept {
    _staged: Vec<DeviceBuffer<u8>>,
    _held: Vec<Arc<dyn Any + Send + Sync>>,
}

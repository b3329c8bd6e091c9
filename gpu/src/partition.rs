//! SM partitions: how a pool splits each device's SMs ([`SmPartition`], asked for with
//! `GpuPoolBuilder::sm_partitions`), the split itself at build, and what each partition got
//! ([`PartitionInfo`]).
//!
//! A partition is a worker group whose workers make every stream (each priority level's, and a
//! replay's capture stream) in the partition's green context, so their work runs on its SMs
//! only; the context they keep bound is the device's primary one, as every worker's (see
//! `driver/green.rs` for why). The sizes are exact: a count the device cannot give is an error
//! of the build, never rounded.

use std::sync::{Arc, Mutex};

use boundpool_scheduler::{GroupId, Placement};
use cudarc::driver::{CudaContext, CudaStream};

use crate::driver::green::{self, GreenCtx, GreenStream, SmDesc, SmLimits, SmSet};
use crate::driver::{self, Ctx, DResult, Dev, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};

/// One partition of each device's SMs, as a pool is asked to make it
/// ([`GpuPoolBuilder::sm_partitions`](crate::GpuPoolBuilder::sm_partitions)).
///
/// ```
/// use boundpool_gpu::SmPartition;
/// // 8 SMs for a latency-critical path (one worker), the rest for bulk work (three workers).
/// let parts = vec![SmPartition::new("latency", 8), SmPartition::rest("bulk").workers(3)];
/// assert_eq!(parts[1].name(), "bulk");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmPartition {
    name: String,
    /// `None`: the SMs the other partitions leave.
    sms: Option<u32>,
    workers: usize,
}

impl SmPartition {
    /// `sms` SMs of each device, exactly (a count the device cannot give, such as one under
    /// its smallest partition or between two of its steps, fails the build), with one worker.
    pub fn new(name: &str, sms: u32) -> Self {
        Self {
            name: name.to_owned(),
            sms: Some(sms),
            workers: 1,
        }
    }

    /// The SMs the other partitions leave (at most one such partition), with one worker.
    pub fn rest(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            sms: None,
            workers: 1,
        }
    }

    /// The partition's workers on each device (at least one).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Its name (its group is `gpu<ordinal>.<name>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The SMs asked for (`None`: the rest).
    pub fn sms(&self) -> Option<u32> {
        self.sms
    }

    /// Its workers on each device.
    pub fn worker_count(&self) -> usize {
        self.workers
    }
}

/// What one partition of a device got ([`GpuDevice::partitions`](crate::GpuDevice::partitions)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Its name, as asked.
    pub name: String,
    /// Its SMs, as the driver gave them back.
    pub sms: u32,
    /// Its worker group (`gpu<ordinal>.<name>`).
    pub group: GroupId,
    /// Its workers.
    pub workers: usize,
}

impl PartitionInfo {
    /// Where to place a node so that its work runs on this partition's SMs.
    pub fn placement(&self) -> Placement {
        Placement::Group(self.group)
    }
}

/// Checks what can be checked without a device: names, workers, at most one rest.
pub(crate) fn check_specs(specs: &[SmPartition]) -> GpuResult<()> {
    let bad = |m: String| Err(GpuError::new(GpuErrorKind::Partition, m));
    let mut names: Vec<&str> = Vec::new();
    for p in specs {
        if p.name.is_empty() || p.name.contains(|c: char| c.is_whitespace() || c == '.') {
            return bad(format!(
                "SM partition name {:?}: names must be non-empty, without spaces or dots",
                p.name
            ));
        }
        if names.contains(&p.name.as_str()) {
            return bad(format!("SM partition '{}' is named twice", p.name));
        }
        names.push(&p.name);
        if p.workers == 0 {
            return bad(format!(
                "SM partition '{}' has no worker (at least one)",
                p.name
            ));
        }
        if p.sms == Some(0) {
            return bad(format!("SM partition '{}' asks for 0 SMs", p.name));
        }
    }
    if specs.iter().filter(|p| p.sms.is_none()).count() > 1 {
        return bad("more than one SM partition takes the rest".into());
    }
    Ok(())
}

/// Checks the sizes against a device's limits (`device` names it in errors): each asked count
/// one the driver gives exactly, their sum within the device, a rest partition left SMs.
/// Returns the SMs no partition gets.
pub(crate) fn check_sizes(specs: &[SmPartition], limits: SmLimits, device: &str) -> GpuResult<u32> {
    let bad = |m: String| Err(GpuError::new(GpuErrorKind::Partition, m));
    let (min, step) = (limits.min_partition, limits.alignment);
    let mut used = 0u32;
    for p in specs {
        let Some(n) = p.sms else { continue };
        if n < min || n % step != 0 {
            return bad(format!(
                "SM partition '{}' asks for {n} SMs; {device} makes partitions of at least {min} SMs, in steps of {step}",
                p.name
            ));
        }
        used = used.saturating_add(n);
    }
    if used > limits.count {
        return bad(format!(
            "the SM partitions ask for {used} SMs; {device} has {}",
            limits.count
        ));
    }
    let left = limits.count - used;
    match specs.iter().find(|p| p.sms.is_none()) {
        Some(rest) if left < min => bad(format!(
            "SM partition '{}' takes the rest, but the others leave {left} SMs of {device}'s {} (at least {min} needed)",
            rest.name, limits.count
        )),
        Some(_) => Ok(0),
        None => Ok(left),
    }
}

/// A device's partition as split at build, before any worker starts: its name, the
/// descriptor its green context is made from, and its SMs.
pub(crate) struct PlannedPartition {
    pub(crate) name: String,
    pub(crate) desc: SmDesc,
    pub(crate) sms: u32,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Splits device `dev`'s SMs as `specs` ask, in one split call (so the partitions are
/// disjoint): the device into groups of the sizes' greatest common divisor, each sized
/// partition a run of consecutive groups, the rest partition (if any) the groups left and the
/// split's remainder. Returns the partitions in the order of `specs` and the SMs left unused.
pub(crate) fn split_device(
    dev: Dev,
    device: &str,
    specs: &[SmPartition],
) -> GpuResult<(Vec<PlannedPartition>, u32)> {
    let version =
        driver::driver_version().map_err(|e| GpuError::driver("cuDriverGetVersion", device, e))?;
    if version < green::GREEN_MIN_DRIVER {
        return Err(GpuError::new(
            GpuErrorKind::Partition,
            format!(
                "SM partitions need green contexts with their own streams: a CUDA driver of {}.{} or newer; this one is {}.{}",
                green::GREEN_MIN_DRIVER / 1000,
                green::GREEN_MIN_DRIVER % 1000 / 10,
                version / 1000,
                version % 1000 / 10
            ),
        ));
    }
    let (all, limits) = green::device_sms(dev).map_err(|e| {
        GpuError::new(
            GpuErrorKind::Partition,
            format!(
                "{device} cannot be split into SM partitions (cuDeviceGetDevResource: {})",
                driver::error_name(e)
            ),
        )
        .with_source(e)
    })?;
    check_sizes(specs, limits, device)?;
    let drv = |call: &str, e| GpuError::driver(call, &format!("{device}: SM partitions"), e);
    let unit = specs.iter().filter_map(|p| p.sms).fold(0, gcd);
    let (groups, remainder) = if unit == 0 {
        // Only a rest partition: the whole device.
        (Vec::new(), all)
    } else {
        green::split(&all, unit, limits.count / unit)
            .map_err(|e| drv("cuDevSmResourceSplitByCount", e))?
    };
    if let Some(g) = groups.iter().find(|g| g.count() != unit) {
        return Err(GpuError::new(
            GpuErrorKind::Partition,
            format!(
                "{device} split its SMs into groups of {} where {unit} were asked",
                g.count()
            ),
        ));
    }
    let mut next = 0;
    let mut out = Vec::new();
    let mut rest_at = None;
    for p in specs {
        let Some(n) = p.sms else {
            rest_at = Some(out.len());
            out.push(None);
            continue;
        };
        let k = (n / unit) as usize;
        let Some(pieces) = groups.get(next..next + k) else {
            return Err(GpuError::new(
                GpuErrorKind::Partition,
                format!(
                    "SM partition '{}': {device} gave {} groups of {unit} SMs, fewer than the partitions need",
                    p.name,
                    groups.len()
                ),
            ));
        };
        next += k;
        let desc = SmDesc::of(pieces).map_err(|e| drv("cuDevResourceGenerateDesc", e))?;
        out.push(Some(planned(&p.name, desc)));
    }
    let mut left: Vec<SmSet> = groups[next..].to_vec();
    if remainder.count() > 0 {
        left.push(remainder);
    }
    let left_sms: u32 = left.iter().map(SmSet::count).sum();
    let unused = match rest_at {
        None => left_sms,
        Some(i) => {
            // The remainder joins the rest where the driver allows it (a descriptor takes
            // pieces of one split of the same alignment), else it stays unused.
            let (desc, unused) = match SmDesc::of(&left) {
                Ok(d) => (d, 0),
                Err(_) if left.len() > 1 && remainder.count() > 0 => {
                    let d = SmDesc::of(&left[..left.len() - 1])
                        .map_err(|e| drv("cuDevResourceGenerateDesc", e))?;
                    (d, remainder.count())
                }
                Err(e) => return Err(drv("cuDevResourceGenerateDesc", e)),
            };
            let name = &specs.iter().find(|p| p.sms.is_none()).expect("a rest").name;
            out[i] = Some(planned(name, desc));
            unused
        }
    };
    Ok((
        out.into_iter()
            .map(|p| p.expect("every partition planned"))
            .collect(),
        unused,
    ))
}

fn planned(name: &str, desc: SmDesc) -> PlannedPartition {
    PlannedPartition {
        name: name.to_owned(),
        sms: desc.sms(),
        desc,
    }
}

/// A device's partitions at run time: planned at build, their green contexts made by the
/// device's first worker to bind and destroyed by its last, and every stream made in them.
#[derive(Default)]
pub(crate) struct DevicePartitions {
    pub(crate) planned: Vec<PlannedPartition>,
    /// SMs no partition got (no rest partition was asked for).
    pub(crate) unused_sms: u32,
    /// One per planned partition once the first worker bound.
    green: Mutex<Vec<GreenCtx>>,
    /// Every stream made in a green context, as cudarc's (borrowed: cudarc never destroys
    /// it) with its owner; `true` once retired (a capture's, after the capture): destroyed
    /// when no clone of it is left, at the next stream made or at teardown.
    streams: Mutex<Vec<(GreenStream, Arc<CudaStream>, bool)>>,
}

impl DevicePartitions {
    pub(crate) fn new(planned: Vec<PlannedPartition>, unused_sms: u32) -> Self {
        Self {
            planned,
            unused_sms,
            ..Default::default()
        }
    }

    pub(crate) fn is_partitioned(&self) -> bool {
        !self.planned.is_empty()
    }

    /// Makes the green contexts (once; the caller holds the device's bind lock and has the
    /// primary context current).
    pub(crate) fn make_contexts(&self, ctx: Ctx, dev: Dev, device: &str) -> GpuResult<()> {
        let mut green = lock(&self.green);
        if !green.is_empty() || self.planned.is_empty() {
            return Ok(());
        }
        let made = self.planned.iter().try_fold(Vec::new(), |mut made, p| {
            let g = match GreenCtx::create(ctx, dev, &p.desc) {
                Ok(g) => g,
                Err(e) => {
                    let what = format!("{device}: SM partition '{}'", p.name);
                    return Err((made, GpuError::driver("cuGreenCtxCreate", &what, e)));
                }
            };
            let got = g.sm_count().unwrap_or(p.sms);
            made.push(g);
            if got != p.sms {
                let why = format!(
                    "{device}: SM partition '{}' was split with {} SMs but its green context has {got}",
                    p.name, p.sms
                );
                return Err((made, GpuError::new(GpuErrorKind::Partition, why)));
            }
            Ok(made)
        });
        match made {
            Ok(made) => {
                *green = made;
                Ok(())
            }
            Err((made, e)) => {
                // All or none: a later worker's bind tries again (and fails the same way).
                for g in made {
                    let _ = g.destroy(ctx);
                }
                Err(e)
            }
        }
    }

    /// What the partition check expects of a worker of partition `part` (`None`: outside the
    /// partitions): the green context's identity, or 0.
    pub(crate) fn expected(&self, part: Option<usize>) -> Option<usize> {
        if !self.is_partitioned() {
            return None;
        }
        Some(part.map_or(0, |i| lock(&self.green).get(i).map_or(0, GreenCtx::id)))
    }

    /// A new stream of partition `part` at `priority`, as cudarc's type (on a bound worker).
    pub(crate) fn stream(
        &self,
        ctx: Ctx,
        cuda: &Arc<CudaContext>,
        part: usize,
        priority: i32,
    ) -> DResult<Arc<CudaStream>> {
        let green = lock(&self.green);
        let g = green
            .get(part)
            .expect("partition streams are made after the contexts");
        let owner = g.stream(ctx, priority)?;
        drop(green);
        let stream = owner.borrowed(cuda);
        let mut streams = lock(&self.streams);
        // Retired streams no one holds any more go now.
        let mut i = 0;
        while i < streams.len() {
            if streams[i].2 && Arc::strong_count(&streams[i].1) == 1 {
                let (o, s, _) = streams.swap_remove(i);
                drop(s);
                let _ = o.destroy(ctx);
            } else {
                i += 1;
            }
        }
        streams.push((owner, stream.clone(), false));
        Ok(stream)
    }

    /// Marks a stream of [`stream`](Self::stream) as no longer used by its maker (destroyed once
    /// no clone of it is left).
    pub(crate) fn retire(&self, s: &Arc<CudaStream>) {
        let view = StreamRef::of(s);
        if let Some(e) = lock(&self.streams).iter_mut().find(|e| e.0.view() == view) {
            e.2 = true;
        }
    }

    /// Teardown, by the device's last worker, after every worker stopped: each stream is
    /// waited for and destroyed unless a clone of it is still held (a node body's, kept past
    /// the pool: that one is left to the driver, detached once its context goes), then the
    /// green contexts.
    pub(crate) fn teardown(&self, ctx: Ctx, failed: bool) {
        for (owner, stream, _) in std::mem::take(&mut *lock(&self.streams)) {
            if !failed {
                let _ = driver::stream_synchronize(ctx, owner.view());
            }
            if Arc::strong_count(&stream) == 1 {
                drop(stream);
                let _ = owner.destroy(ctx);
            }
        }
        for g in std::mem::take(&mut *lock(&self.green)) {
            let _ = g.destroy(ctx);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: SmLimits = SmLimits {
        count: 132,
        min_partition: 8,
        alignment: 8,
    };

    #[test]
    fn names_workers_and_rests_are_checked_before_any_device() {
        let ok = [SmPartition::new("a", 8), SmPartition::rest("b").workers(2)];
        assert!(check_specs(&ok).is_ok());
        let twice = [SmPartition::new("a", 8), SmPartition::new("a", 16)];
        assert!(check_specs(&twice)
            .unwrap_err()
            .to_string()
            .contains("'a' is named twice"));
        let idle = [SmPartition::new("a", 8).workers(0)];
        assert!(check_specs(&idle)
            .unwrap_err()
            .to_string()
            .contains("no worker"));
        let rests = [SmPartition::rest("a"), SmPartition::rest("b")];
        assert!(check_specs(&rests)
            .unwrap_err()
            .to_string()
            .contains("more than one"));
        let dotted = [SmPartition::new("a.b", 8)];
        assert!(check_specs(&dotted)
            .unwrap_err()
            .to_string()
            .contains("\"a.b\""));
        let empty = [SmPartition::new("a", 0)];
        assert_eq!(
            check_specs(&empty).unwrap_err().kind(),
            GpuErrorKind::Partition
        );
    }

    #[test]
    fn sizes_are_exact_or_refused_naming_the_partition_and_the_device() {
        let d = "device 0 (H100)";
        let fits = [SmPartition::new("lat", 8), SmPartition::rest("bulk")];
        assert_eq!(check_sizes(&fits, H100, d).unwrap(), 0);
        let unused = [SmPartition::new("lat", 16), SmPartition::new("mid", 32)];
        assert_eq!(check_sizes(&unused, H100, d).unwrap(), 132 - 48);
        let small = [SmPartition::new("lat", 4)];
        let e = check_sizes(&small, H100, d).unwrap_err().to_string();
        assert!(
            e.contains("'lat' asks for 4 SMs") && e.contains("at least 8"),
            "{e}"
        );
        let between = [SmPartition::new("lat", 12)];
        let e = check_sizes(&between, H100, d).unwrap_err().to_string();
        assert!(e.contains("in steps of 8") && e.contains(d), "{e}");
        let over = [SmPartition::new("a", 128), SmPartition::new("b", 8)];
        let e = check_sizes(&over, H100, d).unwrap_err().to_string();
        assert!(
            e.contains("ask for 136 SMs") && e.contains("has 132"),
            "{e}"
        );
        let no_rest = [SmPartition::new("a", 128), SmPartition::rest("b")];
        let e = check_sizes(&no_rest, H100, d).unwrap_err().to_string();
        assert!(
            e.contains("'b' takes the rest") && e.contains("leave 4 SMs"),
            "{e}"
        );
    }
}

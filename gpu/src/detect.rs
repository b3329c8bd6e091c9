//! Finding the driver and the devices, before any call that could panic, and choosing cores.

use crate::device::DeviceInfo;
use crate::driver::{self, Dev};
use crate::error::{GpuError, GpuErrorKind, GpuResult};

/// Checks that the driver library loads and initialises; returns the number of devices.
pub(crate) fn detect() -> GpuResult<usize> {
    if !driver::library_present() {
        return Err(GpuError::new(
            GpuErrorKind::NoDriver,
            "no CUDA driver: libcuda could not be loaded (no NVIDIA driver on this machine?)",
        ));
    }
    driver::init().map_err(|e| {
        let mut err = GpuError::driver("cuInit", "CUDA driver", e);
        if driver::is_no_device(e) {
            err = GpuError::new(GpuErrorKind::NoDevice, err.message().to_owned()).with_source(e);
        }
        err
    })?;
    let n = driver::device_count().map_err(|e| GpuError::driver("cuDeviceGetCount", "", e))?;
    Ok(n.max(0) as usize)
}

/// Why GPU work cannot run here, or `None` when at least one device is usable.
pub fn gpu_unavailable_reason() -> Option<String> {
    match detect() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Number of CUDA devices, or the reason there are none usable.
pub fn device_count() -> GpuResult<usize> {
    detect()
}

/// Facts about device `ordinal` (no context is created).
pub fn device_info(ordinal: i32) -> GpuResult<DeviceInfo> {
    let n = detect()?;
    if ordinal < 0 || ordinal as usize >= n {
        return Err(GpuError::new(
            GpuErrorKind::NoDevice,
            format!("device {ordinal} does not exist (the driver reports {n} device(s))"),
        ));
    }
    let (_, info) = open_device(ordinal)?;
    Ok(info)
}

pub(crate) fn open_device(ordinal: i32) -> GpuResult<(Dev, DeviceInfo)> {
    let what = format!("device {ordinal}");
    let dev = driver::device_get(ordinal).map_err(|e| GpuError::driver("cuDeviceGet", &what, e))?;
    let name =
        driver::device_name(dev).map_err(|e| GpuError::driver("cuDeviceGetName", &what, e))?;
    let pci_bus_id = driver::device_pci_bus_id(dev)
        .map_err(|e| GpuError::driver("cuDeviceGetPCIBusId", &what, e))?;
    let total_memory = driver::device_total_mem(dev)
        .map_err(|e| GpuError::driver("cuDeviceTotalMem", &what, e))?;
    let sms = driver::device_sm_count(dev)
        .map_err(|e| GpuError::driver("cuDeviceGetAttribute", &what, e))?;
    let local_cores = local_cpulist(&pci_bus_id);
    Ok((
        dev,
        DeviceInfo {
            ordinal,
            name,
            pci_bus_id,
            total_memory,
            sms,
            local_cores,
        },
    ))
}

/// Version of the driver (e.g. 13000 for 13.0).
pub fn driver_version() -> GpuResult<i32> {
    detect()?;
    driver::driver_version().map_err(|e| GpuError::driver("cuDriverGetVersion", "", e))
}

/// Cores the kernel says are local to the PCI device (`/sys/bus/pci/devices/<id>/local_cpulist`).
pub(crate) fn local_cpulist(pci_bus_id: &str) -> Vec<usize> {
    let id = pci_bus_id.to_ascii_lowercase();
    let path = format!("/sys/bus/pci/devices/{id}/local_cpulist");
    std::fs::read_to_string(path)
        .map(|s| parse_cpulist(&s))
        .unwrap_or_default()
}

/// Parses a Linux cpulist such as `0-3,8,10-11`.
pub(crate) fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        if let Some((a, b)) = part.split_once('-') {
            if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                out.extend(a..=b);
            }
        } else if let Ok(a) = part.parse::<usize>() {
            out.push(a);
        }
    }
    out
}

/// Cores this process may run on (its affinity mask), sorted.
pub(crate) fn process_cores() -> Vec<usize> {
    let mut v: Vec<usize> = core_affinity_list();
    v.sort_unstable();
    v.dedup();
    v
}

fn core_affinity_list() -> Vec<usize> {
    // /proc/self/status "Cpus_allowed_list" is the affinity mask; fall back to 0..n.
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        for line in s.lines() {
            if let Some(rest) = line.strip_prefix("Cpus_allowed_list:") {
                let v = parse_cpulist(rest);
                if !v.is_empty() {
                    return v;
                }
            }
        }
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

/// Picks `workers` cores for each device: GPU-local cores first (those of the process's
/// cores that the system says are local to it), spread so devices overlap as little as
/// possible; then round-robin over the process's cores.
pub(crate) fn plan_cores(
    devices: &[DeviceInfo],
    workers: usize,
    process: &[usize],
) -> Vec<Vec<usize>> {
    let n_dev = devices.len().max(1);
    let mut plans = Vec::with_capacity(devices.len());
    for (i, d) in devices.iter().enumerate() {
        let local: Vec<usize> = d
            .local_cores
            .iter()
            .copied()
            .filter(|c| process.contains(c))
            .collect();
        let pool: Vec<usize> = if !local.is_empty() {
            local
        } else if process.is_empty() {
            vec![0]
        } else {
            // Spread devices over disjoint slices of the process's cores where possible.
            let per = (process.len() / n_dev).max(1);
            let start = (i * per) % process.len();
            let mut v: Vec<usize> = process[start..]
                .iter()
                .chain(&process[..start])
                .copied()
                .collect();
            v.truncate(per.max(workers.min(process.len())));
            v
        };
        // Offset within a shared local set so devices on one NUMA node don't stack up.
        let sharing = devices
            .iter()
            .take(i)
            .filter(|o| !o.local_cores.is_empty() && o.local_cores == d.local_cores)
            .count();
        let offset = sharing * workers;
        plans.push(
            (0..workers)
                .map(|w| pool[(offset + w) % pool.len()])
                .collect(),
        );
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulist() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
    }

    fn info(o: i32, local: Vec<usize>) -> DeviceInfo {
        DeviceInfo {
            ordinal: o,
            name: String::new(),
            pci_bus_id: String::new(),
            total_memory: 0,
            sms: 0,
            local_cores: local,
        }
    }

    #[test]
    fn plans_prefer_local_cores() {
        let process: Vec<usize> = (0..16).collect();
        let p = plan_cores(&[info(0, (8..16).collect()), info(1, vec![])], 4, &process);
        assert_eq!(p[0], vec![8, 9, 10, 11]);
        assert_eq!(p[1], vec![8, 9, 10, 11]);
        let p = plan_cores(&[info(0, vec![]), info(1, vec![])], 4, &process);
        assert_eq!(p[0], vec![0, 1, 2, 3]);
        assert_eq!(p[1], vec![8, 9, 10, 11]);
        let p = plan_cores(&[info(0, vec![0, 1]), info(1, vec![0, 1])], 2, &process);
        assert_eq!(p[0], vec![0, 1]);
        assert_eq!(p[1], vec![0, 1]);
    }
}

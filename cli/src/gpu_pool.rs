//! The GPU pool of the subcommands that take `--gpu` (`run`, `bench`, `bench --latency`,
//! `soak`): whether there is a GPU, and `--partitions SPEC`, parsed into `SmPartition`s when the
//! arguments are parsed (before any GPU is looked for), with what each device got, as one line
//! and as JSON.
//!
//! SPEC is comma-separated `NAME:SMS[:WORKERS]`: SMS a number or `rest` (the SMs the others
//! leave, at most one partition), WORKERS 1 when left out. `latency:8:1,bulk:rest:3` gives 8
//! SMs and one worker to `latency`, the rest of the device and three workers to `bulk`.

use std::process::ExitCode;

use boundpool::gpu::{gpu_unavailable_reason, GpuError, GpuErrorKind, GpuPool, SmPartition};
use clap::Args;
use serde_json::{json, Value};

/// `--partitions`, shared by the subcommands that build a GPU pool (each has `--gpu` and
/// `--threads`).
#[derive(Args, Debug)]
pub(crate) struct PartitionArg {
    /// With --gpu: split device 0's SMs into partitions (green contexts; CUDA driver 12.5 or
    /// newer), each a worker group of its own. SPEC: comma-separated `NAME:SMS[:WORKERS]`, SMS a
    /// number or `rest` (the SMs the others leave; at most one), WORKERS 1 if left out, e.g.
    /// `latency:8:1,bulk:rest:3`. The GPU pool's workers are then the partitions' (so no
    /// --threads); GPU nodes run on any of them (`bench --latency`: the foreground on the first
    /// partition, the background on the last). Prints what each partition got before running
    /// (in the JSON too). A size the device cannot give exits 2.
    #[arg(
        long,
        value_name = "SPEC",
        value_parser = parse,
        requires = "gpu",
        conflicts_with = "threads"
    )]
    pub(crate) partitions: Option<PartitionSpec>,
}

impl PartitionArg {
    /// The partitions asked for, or none.
    pub(crate) fn list(&self) -> Vec<SmPartition> {
        self.partitions
            .as_ref()
            .map(|s| s.0.clone())
            .unwrap_or_default()
    }

    /// The workers of each device that the partitions ask for, if given.
    pub(crate) fn workers(&self) -> Option<usize> {
        self.partitions
            .as_ref()
            .map(|s| s.0.iter().map(SmPartition::worker_count).sum())
    }
}

/// With no GPU, says so as `boundpool CMD --gpu` and gives exit status 2.
pub(crate) fn no_gpu(cmd: &str) -> Option<ExitCode> {
    let why = gpu_unavailable_reason()?;
    eprintln!("boundpool {cmd} --gpu: no GPU: {why}");
    Some(ExitCode::from(2))
}

/// The command's GPU pool on device 0 (`workers` workers, or the partitions' of `part`) and
/// what each partition got, printed unless `json`; a pool that cannot be built is reported as
/// `cmd`'s error and its exit status.
pub(crate) fn open(
    cmd: &str,
    workers: usize,
    part: &PartitionArg,
    json: bool,
) -> Result<(GpuPool, Vec<DeviceSplit>), ExitCode> {
    let pool = boundpool_workloads::gpu_pool_with(workers, part.list()).map_err(|e| {
        eprintln!("boundpool {cmd}: {e}");
        build_failure(&e)
    })?;
    let splits = splits(&pool);
    if !json {
        print_lines(&splits);
    }
    Ok((pool, splits))
}

/// The form of a spec, as error messages show it.
pub(crate) const FORM: &str =
    "NAME:SMS[:WORKERS],... (SMS a number or `rest`, WORKERS 1 if left out), e.g. latency:8:1,bulk:rest:3";

/// A parsed `--partitions` spec: the partitions in the order given (never empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PartitionSpec(pub(crate) Vec<SmPartition>);

/// Parses `--partitions` (clap's value parser): every name, size and worker count is checked
/// here, so that a malformed spec fails with exit 2 before any GPU is looked for. Whether the
/// device can give the sizes is checked when the pool is built.
pub(crate) fn parse(spec: &str) -> Result<PartitionSpec, String> {
    let bad = |what: String| Err(format!("{what}; expected {FORM}"));
    if spec.trim().is_empty() {
        return bad("no partition given".into());
    }
    let mut out: Vec<SmPartition> = Vec::new();
    let mut rest: Option<String> = None;
    for (i, entry) in spec.split(',').enumerate() {
        let at = format!("partition {} (`{}`)", i + 1, entry.trim());
        let entry = entry.trim();
        if entry.is_empty() {
            return bad(format!(
                "partition {} is empty (two commas in a row, or one at an end)",
                i + 1
            ));
        }
        let fields: Vec<&str> = entry.split(':').map(str::trim).collect();
        let (name, sms, workers) = match fields[..] {
            [name, sms] => (name, sms, None),
            [name, sms, workers] => (name, sms, Some(workers)),
            _ => {
                return bad(format!(
                    "{at}: {} field(s); a partition is NAME:SMS or NAME:SMS:WORKERS",
                    fields.len()
                ))
            }
        };
        if name.is_empty() {
            return bad(format!("{at}: the name is empty"));
        }
        if name.contains(|c: char| c.is_whitespace() || c == '.') {
            return bad(format!(
                "{at}: the name `{name}` has a space or a dot (it names the worker group gpu<ordinal>.<name>)"
            ));
        }
        if out.iter().any(|p| p.name() == name) {
            return bad(format!("{at}: the name `{name}` is given twice"));
        }
        let p = match sms {
            "rest" => {
                if let Some(first) = &rest {
                    return bad(format!(
                        "{at}: `rest` given twice (partition `{first}` already takes the rest; at most one may)"
                    ));
                }
                rest = Some(name.to_owned());
                SmPartition::rest(name)
            }
            "" => return bad(format!("{at}: the SMs are missing")),
            _ => match sms.parse::<u32>() {
                Ok(0) => return bad(format!("{at}: 0 SMs (at least 1, or `rest`)")),
                Ok(n) => SmPartition::new(name, n),
                Err(_) if sms.bytes().all(|b| b.is_ascii_digit()) => {
                    return bad(format!("{at}: {sms} SMs is too many"))
                }
                Err(_) => {
                    return bad(format!(
                        "{at}: the SMs `{sms}` are neither a number nor `rest`"
                    ))
                }
            },
        };
        let p = match workers {
            None => p,
            Some("") => return bad(format!("{at}: the workers are missing after the last `:`")),
            Some(w) => match w.parse::<usize>() {
                Ok(0) => return bad(format!("{at}: 0 workers (at least 1)")),
                Ok(n) => p.workers(n),
                Err(_) => return bad(format!("{at}: the workers `{w}` are not a positive number")),
            },
        };
        out.push(p);
    }
    Ok(PartitionSpec(out))
}

/// The exit status of a GPU pool that did not start: 2 for SM partitions the device cannot give
/// (bad arguments), else 1.
pub(crate) fn build_failure(e: &GpuError) -> ExitCode {
    ExitCode::from(if e.kind() == GpuErrorKind::Partition {
        2
    } else {
        1
    })
}

/// One partition of a device, as the pool reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) name: String,
    /// Its SMs, as the driver gave them.
    pub(crate) sms: u32,
    /// Its worker group's name (`gpu<ordinal>.<name>`).
    pub(crate) group: String,
    pub(crate) workers: usize,
}

/// How one device of a pool is split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceSplit {
    pub(crate) ordinal: i32,
    /// The device's name, as the driver reports it.
    pub(crate) name: String,
    /// The device's SMs.
    pub(crate) sms: u32,
    pub(crate) parts: Vec<Part>,
    /// SMs no partition got.
    pub(crate) unused_sms: u32,
}

/// The split of each of `pool`'s devices that has SM partitions.
pub(crate) fn splits(pool: &GpuPool) -> Vec<DeviceSplit> {
    let infos = pool.pool().workers();
    pool.devices()
        .iter()
        .filter(|d| !d.partitions().is_empty())
        .map(|d| DeviceSplit {
            ordinal: d.ordinal(),
            name: d.info().name.clone(),
            sms: d.info().sms,
            parts: d
                .partitions()
                .iter()
                .map(|p| Part {
                    name: p.name.clone(),
                    sms: p.sms,
                    group: infos
                        .iter()
                        .find(|w| w.group == p.group)
                        .map_or_else(|| format!("#{}", p.group.index()), |w| w.group_name.clone()),
                    workers: p.workers,
                })
                .collect(),
            unused_sms: d.unused_sms(),
        })
        .collect()
}

impl DeviceSplit {
    /// One line: the device, then each partition's SMs, group and workers, then the unused SMs.
    pub(crate) fn line(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| {
                format!(
                    "{} {} SMs (group {}, {} worker{})",
                    p.name,
                    p.sms,
                    p.group,
                    p.workers,
                    if p.workers == 1 { "" } else { "s" }
                )
            })
            .collect();
        format!(
            "SM partitions of GPU {} ({}, {} SMs): {}; unused SMs: {}",
            self.ordinal,
            self.name,
            self.sms,
            parts.join(", "),
            self.unused_sms
        )
    }

    /// The same as a JSON object.
    pub(crate) fn json(&self) -> Value {
        json!({
            "device": self.ordinal,
            "name": self.name,
            "sms": self.sms,
            "partitions": self.parts.iter().map(|p| json!({
                "name": p.name,
                "sms": p.sms,
                "group": p.group,
                "workers": p.workers,
            })).collect::<Vec<_>>(),
            "unused_sms": self.unused_sms,
        })
    }
}

/// Prints each device's line on stdout (the commands do so before they run anything).
pub(crate) fn print_lines(splits: &[DeviceSplit]) {
    for s in splits {
        println!("{}", s.line());
    }
}

/// Every device's split as a JSON array.
pub(crate) fn json_of(splits: &[DeviceSplit]) -> Value {
    Value::Array(splits.iter().map(DeviceSplit::json).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(spec: &str) -> Vec<SmPartition> {
        parse(spec).unwrap_or_else(|e| panic!("{spec:?}: {e}")).0
    }

    /// The error for `spec`, which must contain `what` and show the expected form.
    fn err(spec: &str, what: &str) {
        let e = parse(spec).expect_err(spec);
        assert!(e.contains(what), "{spec:?}: {e}");
        assert!(e.contains(FORM), "{spec:?}: {e}");
    }

    #[test]
    fn good_specs_parse() {
        assert_eq!(
            ok("latency:8:1,bulk:rest:3"),
            vec![
                SmPartition::new("latency", 8),
                SmPartition::rest("bulk").workers(3)
            ]
        );
        // Workers default to 1; spaces around fields are allowed; no rest partition is fine.
        assert_eq!(
            ok(" a:16 , b : 8 : 2 "),
            vec![
                SmPartition::new("a", 16),
                SmPartition::new("b", 8).workers(2)
            ]
        );
        assert_eq!(ok("all:rest"), vec![SmPartition::rest("all")]);
        let p = &ok("x:rest:4")[0];
        assert_eq!((p.name(), p.sms(), p.worker_count()), ("x", None, 4));
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        err("", "no partition given");
        err("  ", "no partition given");
        err(":8", "partition 1 (`:8`): the name is empty");
        err("a:8,:rest", "partition 2 (`:rest`): the name is empty");
        err("a:x", "the SMs `x` are neither a number nor `rest`");
        err("a:-8", "the SMs `-8` are neither a number nor `rest`");
        err("a:8.5", "neither a number nor `rest`");
        err("a:99999999999", "99999999999 SMs is too many");
        err("a:0", "0 SMs");
        err("a::2", "the SMs are missing");
        err("a:8:0", "0 workers");
        err("a:8:", "the workers are missing");
        err("a:8:many", "the workers `many` are not a positive number");
        err("a:8:-1", "the workers `-1` are not a positive number");
        err(
            "a:rest,b:rest",
            "partition 2 (`b:rest`): `rest` given twice (partition `a` already takes the rest",
        );
        err("a", "partition 1 (`a`): 1 field(s)");
        err("a:8:1:2", "4 field(s)");
        err("a:8,,b:8", "partition 2 is empty");
        err("a:8,", "partition 2 is empty");
        err("a:8,a:8", "the name `a` is given twice");
        err("my part:8", "has a space or a dot");
        err("a.b:8", "has a space or a dot");
    }

    #[test]
    fn what_the_pool_got_prints_as_one_line_and_json() {
        let s = DeviceSplit {
            ordinal: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            sms: 132,
            parts: vec![
                Part {
                    name: "latency".into(),
                    sms: 8,
                    group: "gpu0.latency".into(),
                    workers: 1,
                },
                Part {
                    name: "bulk".into(),
                    sms: 124,
                    group: "gpu0.bulk".into(),
                    workers: 3,
                },
            ],
            unused_sms: 0,
        };
        assert_eq!(
            s.line(),
            "SM partitions of GPU 0 (NVIDIA H100 80GB HBM3, 132 SMs): latency 8 SMs (group \
             gpu0.latency, 1 worker), bulk 124 SMs (group gpu0.bulk, 3 workers); unused SMs: 0"
        );
        let v = json_of(&[s]);
        assert_eq!(v[0]["device"], 0);
        assert_eq!(v[0]["sms"], 132);
        assert_eq!(v[0]["unused_sms"], 0);
        assert_eq!(
            v[0]["partitions"][1],
            json!({"name": "bulk", "sms": 124, "group": "gpu0.bulk", "workers": 3})
        );
    }

    #[test]
    fn workers_are_the_partitions() {
        let none = PartitionArg { partitions: None };
        assert_eq!((none.workers(), none.list()), (None, Vec::new()));
        let two = PartitionArg {
            partitions: Some(parse("a:8:2,b:rest:3").unwrap()),
        };
        assert_eq!(two.workers(), Some(5));
        assert_eq!(two.list().len(), 2);
    }
}

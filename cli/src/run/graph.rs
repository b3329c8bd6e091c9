//! The graph `run` runs, described and checked before any thread starts: a built-in shape of
//! `--size` nodes (with `--work-ns` of busy work in each), or a graph file read and checked with
//! [`boundpool::graph_file`], refused if it cannot fit ([`memory`]); then built into a graph
//! whose node bodies record for the check.

use std::path::Path;
use std::sync::Arc;

use boundpool::{bounded, Graph};
use boundpool_workloads::{Dag, Shape};

use super::memory;
use super::verify::{build_graph, Check};
use super::{Fail, RunArgs};

/// What `run` runs: the graph's name, its shape (or none for a file) and its DAG.
pub(super) struct Described {
    pub(super) name: String,
    pub(super) shape: Option<Shape>,
    pub(super) dag: Dag,
}

/// The graph `a` names: its file, else its shape (default: wavefront). A size that rounds to
/// no nodes gives an empty graph, which runs (and completes at once). A graph whose estimated
/// memory exceeds what this process can have is refused, a shape before it is made.
pub(super) fn describe(a: &RunArgs) -> Result<Described, Fail> {
    match &a.graph {
        Some(path) => {
            let (name, dag) = load(path).map_err(Fail::Input)?;
            let what = format!("the graph of {}", path.display());
            memory::check(&what, dag.len(), dag.edges.len()).map_err(Fail::Input)?;
            Ok(Described {
                name,
                shape: None,
                dag,
            })
        }
        None => {
            let shape = a.shape.unwrap_or_default().shape();
            check_shape(shape, a.size).map_err(Fail::Input)?;
            let mut dag = Dag::shape(shape, a.size);
            dag.work_ns.iter_mut().for_each(|w| *w = a.work_ns);
            Ok(Described {
                name: shape.name().to_string(),
                shape: Some(shape),
                dag,
            })
        }
    }
}

/// Refuses `shape` at `size` when its estimated memory exceeds what this process can have,
/// counting its nodes and edges without making it.
pub(super) fn check_shape(shape: Shape, size: usize) -> Result<(), String> {
    let (nodes, edges) = memory::shape_counts(shape, size);
    memory::check(&format!("--size {size}: a {}", shape.name()), nodes, edges)
}

/// Reads and checks a graph file; returns the graph's name and its DAG, or a message naming the
/// problem (with the file's path).
fn load(path: &Path) -> Result<(String, Dag), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read graph file {}: {e}", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "graph".into());
    let f = boundpool::graph_file::parse(&text, &stem)
        .map_err(|e| format!("bad graph file {}: {e}", path.display()))?;
    let dag = Dag {
        names: f.names,
        work_ns: f.work_ns,
        edges: f.edges,
    };
    Ok((f.name, dag))
}

/// The graph of `d` whose nodes record into `check`. The scheduler's validation error (a cycle
/// names nodes on it) is clipped, so that no graph makes the message long.
pub(super) fn build(d: &Described, a: &RunArgs, check: &Arc<Check>) -> Result<Graph, Fail> {
    build_graph(&d.dag, &d.name, check).map_err(|e| match &a.graph {
        Some(path) => Fail::Input(format!(
            "bad graph file {}: {}",
            path.display(),
            bounded::clip_message(e.to_string())
        )),
        None => Fail::Input(bounded::clip_message(e.to_string())),
    })
}

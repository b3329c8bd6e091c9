//! Graph files on the command line: read the file, check it with [`boundpool::graph_file`], and
//! turn it into a [`Dag`].

use std::path::Path;

use boundpool_workloads::Dag;

/// Reads and checks a graph file; returns the graph's name and its DAG, or a message naming the
/// problem (with the file's path).
pub(crate) fn load(path: &Path) -> Result<(String, Dag), String> {
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

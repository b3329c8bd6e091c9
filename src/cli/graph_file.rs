//! Graph files: `{"nodes": [{"name": "a", "work_ns": 2000}, {"name": "b"}], "edges": [["a", "b"]]}`.
//!
//! Checked here before anything runs: malformed JSON, unknown fields (rejected, so a misspelt
//! `work_ns` is not silently ignored), no nodes, duplicate node names, edges naming a node that is
//! not listed. Cycles are left to the scheduler's own validation (`GraphBuilder::build`), whose
//! message names the nodes on the cycle. Repeated edges are kept once.

use std::collections::HashMap;
use std::path::Path;

use boundpool::workloads::Dag;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGraph {
    /// The graph's name (default: the file's stem).
    #[serde(default)]
    name: Option<String>,
    nodes: Vec<FileNode>,
    #[serde(default)]
    edges: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNode {
    name: String,
    #[serde(default)]
    work_ns: u64,
}

/// Reads and checks a graph file; returns the graph's name and its DAG, or a message naming the
/// problem (with the file's path).
pub(crate) fn load(path: &Path) -> Result<(String, Dag), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read graph file {}: {e}", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "graph".into());
    parse(&text, &stem).map_err(|e| format!("bad graph file {}: {e}", path.display()))
}

/// Parses and checks a graph file's text.
pub(crate) fn parse(text: &str, default_name: &str) -> Result<(String, Dag), String> {
    let f: FileGraph = serde_json::from_str(text).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => format!("{e}"),
        _ => format!("malformed JSON: {e}"),
    })?;
    if f.nodes.is_empty() {
        return Err("the graph has no nodes".into());
    }
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(f.nodes.len());
    for (i, n) in f.nodes.iter().enumerate() {
        if let Some(prev) = index.insert(n.name.as_str(), i as u32) {
            return Err(format!(
                "duplicate node name \"{}\" (nodes #{prev} and #{i})",
                n.name
            ));
        }
    }
    let mut edges = Vec::with_capacity(f.edges.len());
    for (k, (a, b)) in f.edges.iter().enumerate() {
        let find = |n: &str| {
            index.get(n).copied().ok_or_else(|| {
                format!(
                    "edge #{k} [\"{a}\", \"{b}\"] names unknown node \"{n}\" (not in \"nodes\")"
                )
            })
        };
        edges.push((find(a)?, find(b)?));
    }
    edges.sort_unstable();
    edges.dedup();
    let name = f.name.unwrap_or_else(|| default_name.to_string());
    let dag = Dag {
        names: f.nodes.iter().map(|n| n.name.clone()).collect(),
        work_ns: f.nodes.iter().map(|n| n.work_ns).collect(),
        edges,
    };
    Ok((name, dag))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn good_file() {
        let (name, dag) =
            parse(r#"{"nodes": [{"name": "a", "work_ns": 2000}, {"name": "b"}], "edges": [["a", "b"], ["a", "b"]]}"#, "g").unwrap();
        assert_eq!(name, "g");
        assert_eq!(dag.names, vec!["a", "b"]);
        assert_eq!(dag.work_ns, vec![2000, 0]);
        assert_eq!(dag.edges, vec![(0, 1)]);
    }

    #[test]
    fn bad_files_name_the_problem() {
        let e = parse(r#"{"nodes": [{"name": "a"}, {"name": "a"}]}"#, "g").unwrap_err();
        assert!(e.contains("duplicate node name \"a\""), "{e}");
        let e = parse(r#"{"nodes": [{"name": "a"}], "edges": [["a", "zz"]]}"#, "g").unwrap_err();
        assert!(e.contains("unknown node \"zz\""), "{e}");
        let e = parse(r#"{"nodes": [{"name": "a"}"#, "g").unwrap_err();
        assert!(e.contains("malformed JSON"), "{e}");
        let e = parse(r#"{"nodes": [{"name": "a", "work_n": 3}]}"#, "g").unwrap_err();
        assert!(e.contains("unknown field `work_n`"), "{e}");
        let e = parse(r#"{"nodes": []}"#, "g").unwrap_err();
        assert!(e.contains("no nodes"), "{e}");
    }
}

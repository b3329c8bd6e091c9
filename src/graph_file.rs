//! The graph-file reader: `{"nodes": [{"name": "a", "work_ns": 2000}, {"name": "b"}], "edges": [["a", "b"]]}`.
//! A node may name the rank it runs on (`"rank": 1`) for a run over many processes
//! (`boundpool run --graph FILE --ranks` under `mpirun`); one that names none runs on rank 0.
//!
//! Checked here, before anything is built: malformed JSON, unknown fields (rejected, so a
//! misspelt `work_ns` is not silently ignored), duplicate node names, edges naming a node that is
//! not listed. Cycles are left to the scheduler's own validation (`GraphBuilder::build`), whose
//! message names nodes on the cycle. Repeated edges are kept once. An empty `nodes` list is a
//! graph of no nodes. Every message is bounded: names are cut to [`NAME_CHARS`] characters and
//! the whole message to about [`MESSAGE_CHARS`], whatever the file holds.
//!
//! Uses only `serde`, `serde_json` and [`crate::bounded`], so that the fuzz crate in `fuzz/`
//! compiles this file as it is, without the rest of the package.
//!
//! [`NAME_CHARS`]: crate::bounded::NAME_CHARS
//! [`MESSAGE_CHARS`]: crate::bounded::MESSAGE_CHARS

use std::collections::HashMap;

use serde::Deserialize;

use crate::bounded;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGraph {
    /// The graph's name (default: the caller's, e.g. the file's stem).
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
    #[serde(default)]
    rank: Option<u32>,
}

/// A graph file's content, checked: unique names, edges between listed nodes, no repeated edge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphFile {
    /// The graph's name (the file's `name`, or the default given to [`parse`]).
    pub name: String,
    /// Node names, in file order.
    pub names: Vec<String>,
    /// Busy work per node, in nanoseconds.
    pub work_ns: Vec<u64>,
    /// The rank each node names (`None`: rank 0), for a run over many processes. Whether it
    /// exists is checked when the graph is lowered for a number of ranks.
    pub ranks: Vec<Option<u32>>,
    /// Edges `(from, to)` as node indices, sorted, each once.
    pub edges: Vec<(u32, u32)>,
}

/// Parses and checks a graph file's text; `default_name` names the graph when the file does not.
/// The error is a short message naming the problem (without the file's path).
pub fn parse(text: &str, default_name: &str) -> Result<GraphFile, String> {
    let f: FileGraph = serde_json::from_str(text).map_err(|e| {
        bounded::clip_message(match e.classify() {
            serde_json::error::Category::Data => format!("{e}"),
            _ => format!("malformed JSON: {e}"),
        })
    })?;
    if f.nodes.len() > u32::MAX as usize {
        return Err(format!(
            "{} nodes: at most {} are supported",
            f.nodes.len(),
            u32::MAX
        ));
    }
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(f.nodes.len());
    for (i, n) in f.nodes.iter().enumerate() {
        if let Some(prev) = index.insert(n.name.as_str(), i as u32) {
            return Err(format!(
                "duplicate node name \"{}\" (nodes #{prev} and #{i})",
                bounded::name(&n.name)
            ));
        }
    }
    let mut edges = Vec::with_capacity(f.edges.len());
    for (k, (a, b)) in f.edges.iter().enumerate() {
        let find = |n: &str| {
            index.get(n).copied().ok_or_else(|| {
                format!(
                    "edge #{k} [\"{}\", \"{}\"] names unknown node \"{}\" (not in \"nodes\")",
                    bounded::name(a),
                    bounded::name(b),
                    bounded::name(n)
                )
            })
        };
        edges.push((find(a)?, find(b)?));
    }
    edges.sort_unstable();
    edges.dedup();
    let name = f.name.unwrap_or_else(|| default_name.to_string());
    let ranks = f.nodes.iter().map(|n| n.rank).collect();
    let (names, work_ns) = f.nodes.into_iter().map(|n| (n.name, n.work_ns)).unzip();
    Ok(GraphFile {
        name,
        names,
        work_ns,
        ranks,
        edges,
    })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn good_file() {
        let g =
            parse(r#"{"nodes": [{"name": "a", "work_ns": 2000}, {"name": "b"}], "edges": [["a", "b"], ["a", "b"]]}"#, "g").unwrap();
        assert_eq!(g.name, "g");
        assert_eq!(g.names, vec!["a", "b"]);
        assert_eq!(g.work_ns, vec![2000, 0]);
        assert_eq!(g.ranks, vec![None, None]);
        assert_eq!(g.edges, vec![(0, 1)]);
    }

    #[test]
    fn nodes_may_name_ranks() {
        let g = parse(
            r#"{"nodes": [{"name": "a", "rank": 3}, {"name": "b"}]}"#,
            "g",
        )
        .unwrap();
        assert_eq!(g.ranks, vec![Some(3), None]);
        let e = parse(r#"{"nodes": [{"name": "a", "rank": -1}]}"#, "g").unwrap_err();
        assert!(e.contains("invalid value"), "{e}");
    }

    #[test]
    fn an_empty_graph_is_a_graph() {
        let g = parse(r#"{"nodes": []}"#, "g").unwrap();
        assert!(g.names.is_empty() && g.edges.is_empty());
        let g = parse(r#"{"name": "nothing", "nodes": [], "edges": []}"#, "g").unwrap();
        assert_eq!(g.name, "nothing");
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
        let e = parse(r#"{"edges": []}"#, "g").unwrap_err();
        assert!(e.contains("missing field `nodes`"), "{e}");
    }

    #[test]
    fn messages_about_huge_names_are_bounded() {
        let long = "q".repeat(100_000);
        let cases = [
            format!(r#"{{"nodes": [{{"name": "{long}"}}, {{"name": "{long}"}}]}}"#),
            format!(r#"{{"nodes": [{{"name": "a"}}], "edges": [["a", "{long}"]]}}"#),
            format!(r#"{{"nodes": [{{"name": "a", "{long}": 1}}]}}"#),
            format!(r#"{{"nodes": [{{"name": 5, "x": "{long}"}}]}}"#),
            format!(r#"{{"nodes": "{long}"}}"#),
        ];
        for text in cases {
            let e = parse(&text, "g").unwrap_err();
            assert!(e.len() < 1200, "{} bytes: {}", e.len(), &e[..200]);
        }
    }
}

//! Fuzzes the graph-file reader (`boundpool::graph_file::parse`) and, for every file it accepts,
//! the scheduler's validation of the graph built from it (what `boundpool run --graph` does
//! before any node runs): never a panic, never a hang, and a rejected file always gets a short
//! message.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../src/bounded.rs"]
mod bounded;
#[allow(dead_code)]
#[path = "../../src/graph_file.rs"]
mod graph_file;

/// The longest message the reader may give (see `bounded`: names cut at 64 characters, whole
/// messages at about 512 plus the note of what was left out).
const MESSAGE_LIMIT: usize = 2048;

fuzz_target!(|data: &[u8]| {
    // The command line reads the file with `read_to_string`: non-UTF-8 is an I/O error there.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let g = match graph_file::parse(text, "fuzz") {
        Ok(g) => g,
        Err(m) => {
            assert!(m.len() <= MESSAGE_LIMIT, "a {}-byte message", m.len());
            return;
        }
    };
    // What the reader promises of an accepted file.
    assert_eq!(g.names.len(), g.work_ns.len());
    let n = g.names.len() as u32;
    assert!(g.edges.iter().all(|&(a, b)| a < n && b < n));
    assert!(
        g.edges.windows(2).all(|w| w[0] < w[1]),
        "edges sorted, each once"
    );
    let mut seen = std::collections::HashSet::new();
    assert!(
        g.names.iter().all(|s| seen.insert(s.as_str())),
        "names unique"
    );
    // The scheduler's validation: the only way such a graph can fail is a cycle.
    let mut b = boundpool_scheduler::GraphBuilder::<()>::new(g.name.clone());
    let ids: Vec<_> = g
        .names
        .iter()
        .map(|name| b.node(name.clone(), |_| Ok(())))
        .collect();
    for &(f, t) in &g.edges {
        b.edge(ids[f as usize], ids[t as usize]);
    }
    match b.build() {
        Ok(graph) => assert_eq!(graph.len(), g.names.len()),
        Err(e) => {
            assert_eq!(e.kind(), boundpool_scheduler::ErrorKind::Cycle, "{e}");
            let shown = bounded::clip_message(e.to_string());
            assert!(shown.len() <= MESSAGE_LIMIT);
        }
    }
});

//! Error messages stay short whatever the input: a cycle names at most about ten of its nodes
//! plus its length; a huge node name is cut.

use boundpool_scheduler::{BoxError, Cores, ErrorKind, GraphBuilder, NodeCtx, PoolBuilder};

fn noop() -> impl Fn(&NodeCtx<'_, ()>) -> Result<(), BoxError> + Send + Sync + 'static {
    |_| Ok(())
}

/// Nodes in the big cycle (shrunk under Miri, which is slow).
const BIG: usize = if cfg!(miri) { 40 } else { 3_000_000 };

#[test]
fn a_huge_cycle_names_a_few_nodes_and_its_length() {
    let mut g = GraphBuilder::<()>::with_capacity("ring", BIG, BIG);
    let nodes: Vec<_> = (0..BIG).map(|i| g.node(format!("n{i}"), noop())).collect();
    for i in 0..BIG {
        g.edge(nodes[i], nodes[(i + 1) % BIG]);
    }
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cycle);
    let msg = err.to_string();
    // Before the fix: every node of the cycle, 72 MB for 3,000,000 nodes.
    assert!(msg.len() < 400, "{} bytes: {msg}", msg.len());
    assert!(
        msg.contains(&format!("cycle of {BIG} nodes")),
        "the length is missing: {msg}"
    );
    assert!(msg.contains('…'), "{msg}");
    // It names a run of consecutive nodes of the cycle, and ends where it started.
    let names: Vec<&str> = msg.split('\'').skip(3).step_by(2).collect();
    assert!(names.len() >= 8 && names.len() <= 12, "{names:?} in {msg}");
    assert_eq!(names.first(), names.last(), "{msg}");
    let index = |s: &str| s[1..].parse::<usize>().unwrap();
    assert_eq!(
        (index(names[0]) + 1) % BIG,
        index(names[1]),
        "not an edge: {msg}"
    );
}

#[test]
fn a_short_cycle_is_named_in_full() {
    let mut g = GraphBuilder::<()>::new("tri");
    let a = g.node("a", noop());
    let b = g.node("b", noop());
    let c = g.node("c", noop());
    g.edge(b, c).edge(c, a).edge(a, b);
    let msg = g.build().unwrap_err().to_string();
    assert!(msg.contains("cycle of 3 nodes"), "{msg}");
    assert!(!msg.contains('…'), "{msg}");
    for n in ["'a' (#0)", "'b' (#1)", "'c' (#2)"] {
        assert!(msg.contains(n), "{msg}");
    }
}

#[test]
fn a_huge_node_name_is_cut_in_messages() {
    let huge = "x".repeat(if cfg!(miri) { 1_000 } else { 1_000_000 });
    // A self-loop names the node.
    let mut g = GraphBuilder::<()>::new(huge.clone());
    let a = g.node(huge.clone(), noop());
    g.edge(a, a);
    let msg = g.build().unwrap_err().to_string();
    assert!(msg.len() < 400, "{} bytes", msg.len());
    // A failing node names itself and its graph.
    let pool = PoolBuilder::new()
        .workers(1)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    let mut g = GraphBuilder::<()>::new(huge.clone());
    g.node(huge.clone(), |_| -> Result<(), BoxError> {
        Err("bad".into())
    });
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeFailed);
    let msg = err.to_string();
    assert!(msg.len() < 400, "{} bytes", msg.len());
    assert!(
        msg.contains("xxxx…") && msg.ends_with("failed: bad"),
        "{msg}"
    );
}

#[test]
fn a_core_list_error_is_bounded() {
    let err = PoolBuilder::new()
        .name("cores")
        .cores(Cores::List((0..100_000).collect()))
        .workers(2)
        .build();
    match err {
        // A machine with 100,000 cores would build; nothing to check there.
        Ok(_) => {}
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
            assert!(e.to_string().len() < 400, "{e}");
        }
    }
}

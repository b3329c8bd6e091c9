//! Unit tests of building and validation.

use super::plan::NodeSpec;
use super::*;
use crate::backend::FromIndex;
use crate::ctx::NodeCtx;
use crate::error::{BoxError, ErrorKind};
use crate::ids::{GroupId, NodeRef};
use crate::{Cores, PoolBuilder};

fn noop() -> impl Fn(&NodeCtx<'_, ()>) -> Result<(), BoxError> + Send + Sync + 'static {
    |_| Ok(())
}

#[test]
fn unknown_node_ids_are_reported() {
    let mut g = GraphBuilder::<()>::new("g");
    let a = g.node("a", noop());
    let _b = g.node("b", noop());
    let ghost = NodeId {
        graph: g.uid,
        index: 7,
    };
    g.edge(a, ghost);
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnknownNode);
    let msg = err.to_string();
    assert!(
        msg.contains("#7") && msg.contains("2 node(s)") && msg.contains("'g'"),
        "{msg}"
    );

    let mut g = GraphBuilder::<()>::new("g2");
    let a = g.node("a", noop());
    let ghost = NodeId {
        graph: g.uid,
        index: 1,
    };
    g.edge(ghost, a);
    assert_eq!(g.build().unwrap_err().kind(), ErrorKind::UnknownNode);

    // A placement naming a node that does not exist.
    let mut g = GraphBuilder::<()>::new("g3");
    g.node("a", noop());
    let ghost = NodeId {
        graph: g.uid,
        index: 5,
    };
    g.place(ghost, GroupId::from_index(0));
    assert_eq!(g.build().unwrap_err().kind(), ErrorKind::UnknownNode);
}

#[test]
fn plan_holds_degrees_sources_and_adjacency() {
    // a -> b, a -> c, b -> d, c -> d, plus an isolated e and a duplicate edge c -> d.
    let mut g = GraphBuilder::<()>::new("diamond");
    let a = g.node("a", noop());
    let b = g.node("b", noop());
    let c = g.node("c", noop());
    let d = g.node("d", noop());
    let e = g.node("e", noop());
    g.edge(a, b).edge(a, c).edge(b, d).edge(c, d).edge(c, d);
    let graph = g.build().unwrap();
    let p = &graph.plan;
    let indegree: Vec<u32> = p.nodes.iter().map(|s| s.indegree).collect();
    assert_eq!(indegree, vec![0, 1, 1, 3, 0]);
    assert_eq!(&*p.sources, &[0, 4]);
    assert_eq!(p.successors(0), &[1, 2]);
    assert_eq!(p.successors(2), &[3, 3]);
    assert!(p.successors(3).is_empty() && p.successors(4).is_empty());
    let mut preds = p.predecessors(3).to_vec();
    preds.sort();
    assert_eq!(preds, vec![1, 2, 2]);
    assert!(p.predecessors(0).is_empty());
    assert_eq!(p.check(d.id()), Some(3));
    assert_eq!(
        p.check(NodeId {
            graph: p.uid,
            index: 5
        }),
        None
    );
    assert_eq!(
        p.check(NodeId {
            graph: p.uid + 1,
            index: 0
        }),
        None
    );
    assert_eq!(p.describe(4), "node 'e' (#4) of graph 'diamond'");
    let _ = e;
}

#[test]
fn backward_edges_that_form_no_cycle_build() {
    // Edges from higher to lower index: node order is not a topological order.
    let mut g = GraphBuilder::<()>::new("backward");
    let refs: Vec<NodeRef<()>> = (0..100).map(|i| g.node(format!("n{i}"), noop())).collect();
    for w in refs.windows(2) {
        g.edge(w[1], w[0]);
    }
    let graph = g.build().unwrap();
    assert_eq!(&*graph.plan.sources, &[99]);
}

/// The names of a cycle message, in order.
fn cycle_names(msg: &str) -> Vec<String> {
    msg.split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn cycle_message_lists_the_cycle_in_edge_order() {
    for rot in 0..4 {
        let mut g = GraphBuilder::<()>::new("c");
        let names = ["p", "q", "r", "s", "x", "y"];
        let n: Vec<NodeRef<()>> = names.iter().map(|s| g.node(*s, noop())).collect();
        // Cycle p -> q -> r -> s -> p, entered from x; y hangs off r. Edge order rotated.
        let mut edges = vec![(0, 1), (1, 2), (2, 3), (3, 0)];
        edges.rotate_left(rot);
        edges.push((4, 0));
        edges.push((2, 5));
        for (f, t) in &edges {
            g.edge(n[*f], n[*t]);
        }
        let msg = g.build().unwrap_err().to_string();
        // "graph 'c' has a cycle: 'p' (#0) -> ... -> 'p' (#0)": drop the graph name.
        let cyc = cycle_names(&msg)[1..].to_vec();
        assert_eq!(cyc.first(), cyc.last(), "{msg}");
        let cyc = &cyc[..cyc.len() - 1];
        assert_eq!(cyc.len(), 4, "{msg}");
        let idx = |s: &str| names.iter().position(|x| *x == s).unwrap();
        for w in 0..cyc.len() {
            let (f, t) = (idx(&cyc[w]), idx(&cyc[(w + 1) % cyc.len()]));
            assert!(
                edges.contains(&(f, t)),
                "{} -> {} is not an edge: {msg}",
                cyc[w],
                cyc[(w + 1) % cyc.len()]
            );
        }
    }
}

#[test]
fn wrong_output_type_and_unit_inputs() {
    let pool = PoolBuilder::new()
        .workers(1)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    let mut g = GraphBuilder::<()>::new("types");
    let a = g.node("a", |_| Ok(7u32));
    let u = g.node("u", |_| Ok(()));
    // A reference to `a` with the wrong type: only constructible inside the crate.
    let wrong: NodeRef<u64> = NodeRef::new(a.id());
    let b = g.node("b", move |ctx| {
        let e = ctx.input(wrong).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadInput);
        assert!(
            e.to_string().contains("u64") && e.to_string().contains("'b'"),
            "{e}"
        );
        ctx.input(u)?;
        Ok(*ctx.input(a)? + 1)
    });
    // Reading a `()` node as something else fails: it left no value.
    let wrong_unit: NodeRef<u8> = NodeRef::new(u.id());
    let c = g.node("c", move |ctx| {
        Ok(ctx.input(wrong_unit).map(|_| ()).map_err(|e| e.kind()))
    });
    g.edge(a, b).edge(u, b).edge(u, c);
    let out = pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(out.get(b), Some(&8));
    assert_eq!(out.get(c), Some(&Err(ErrorKind::BadInput)));
    // The output holds `a` as u32, not as u64.
    assert_eq!(out.get(wrong), None);
    assert_eq!(out.get(a), Some(&7));
}

#[test]
fn inlined_nodes_keep_origin_and_base() {
    let mut inner = GraphBuilder::<()>::new("inner");
    let i0 = inner.node("i0", noop());
    let i1 = inner.node("i1", noop());
    inner.edge(i0, i1);
    let inner = inner.build().unwrap();
    let inner_uid = inner.plan.uid;

    let mut mid = GraphBuilder::<()>::new("mid");
    mid.node("m0", noop());
    let s = mid.subgraph(&inner);
    assert_eq!(s.node(i1).id().index(), 2);
    let mid = mid.build().unwrap();
    assert_eq!(mid.plan.nodes[1].origin_base(mid.plan.uid), (inner_uid, 1));
    assert_eq!(
        mid.plan.nodes[0].origin_base(mid.plan.uid),
        (mid.plan.uid, 0)
    );

    let mut outer = GraphBuilder::<()>::new("outer");
    outer.node("o0", noop());
    outer.node("o1", noop());
    let s2 = outer.subgraph(&mid);
    let outer = outer.build().unwrap();
    // mid's node 2 (inner's i1) now sits at 2 + 2 = 4; its body still comes from `inner`.
    assert_eq!(s2.node(s.node(i1)).id().index(), 4);
    let spec = &outer.plan.nodes[4];
    assert_eq!(spec.origin_base(outer.plan.uid), (inner_uid, 2 + 1));
    // mid's own node 0 keeps mid as its origin, now based at 2.
    assert_eq!(
        outer.plan.nodes[2].origin_base(outer.plan.uid),
        (mid.plan.uid, 2)
    );
    assert_eq!(outer.node_name(s2.node(s.node(i1)).id()), Some("i1"));
    assert_eq!(outer.plan.successors(3), &[4]);
}

#[test]
fn device_marks_survive_build_and_inlining_and_a_stranger_is_refused() {
    use crate::backend::GraphBuilderExt;
    let mut inner = GraphBuilder::<()>::new("inner");
    let i0 = inner.node("i0", noop());
    let i1 = inner.node("i1", noop());
    inner.edge(i0, i1).mark_device_node(i1);
    let inner = inner.build().unwrap();
    assert!(!inner.plan.is_device_node(0) && inner.plan.is_device_node(1));

    let mut outer = GraphBuilder::<()>::new("outer");
    let o0 = outer.node("o0", noop());
    outer.mark_device_node(o0);
    let s = outer.subgraph(&inner);
    let outer = outer.build().unwrap();
    let marked: Vec<u32> = (0..3).filter(|&i| outer.plan.is_device_node(i)).collect();
    assert_eq!(marked, vec![0, s.node(i1).id().index() as u32]);
    assert!(!outer.plan.is_device_node(70), "past the end: not marked");

    // No mark at all: no bits kept.
    let plain = GraphBuilder::<()>::new("plain").build().unwrap();
    assert!(plain.plan.device_nodes.is_empty());

    let mut other = GraphBuilder::<()>::new("other");
    other.node("x", noop());
    other.mark_device_node(o0);
    let e = other.build().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ForeignNode, "{e}");
    assert!(e.to_string().contains("device mark"), "{e}");
}

#[test]
fn successor_lists_inline_and_external_keep_edge_order() {
    let mut g = GraphBuilder::<()>::new("fan");
    let n: Vec<NodeRef<()>> = (0..8).map(|i| g.node(format!("n{i}"), noop())).collect();
    // n0 gets five successors (two inline, then the list), interleaved with other edges
    // and with a repeated one; n6 one successor, n5 two.
    g.edge(n[0], n[3])
        .edge(n[5], n[6])
        .edge(n[0], n[1])
        .edge(n[0], n[7]);
    g.edge(n[5], n[7])
        .edge(n[0], n[2])
        .edge(n[6], n[7])
        .edge(n[0], n[3]);
    let graph = g.build().unwrap();
    let p = &graph.plan;
    assert_eq!(p.successors(0), &[3, 1, 7, 2, 3]);
    assert_eq!(p.successors(5), &[6, 7]);
    assert_eq!(p.successors(6), &[7]);
    assert!(p.successors(7).is_empty());
    assert_eq!(graph.edge_count(), 8);
    let indegree: Vec<u32> = p.nodes.iter().map(|s| s.indegree).collect();
    assert_eq!(indegree, vec![0, 1, 1, 2, 0, 0, 1, 3]);
    assert_eq!(&*p.sources, &[0, 4, 5]);
    let mut preds = p.predecessors(7).to_vec();
    preds.sort();
    assert_eq!(preds, vec![0, 5, 6]);
    // n6's one successor has other predecessors: not a chain link.
    assert_eq!(p.nodes[6].chain_successor(), None);
}

#[test]
fn chain_links_need_one_predecessor_and_a_compatible_placement() {
    let mut g = GraphBuilder::<()>::new("links");
    let n: Vec<NodeRef<()>> = (0..5).map(|i| g.node(format!("n{i}"), noop())).collect();
    g.edge(n[0], n[1])
        .edge(n[1], n[2])
        .edge(n[2], n[3])
        .edge(n[3], n[4]);
    // n1 and n2 on group 1; n3 on group 2; n4 anywhere.
    g.place(n[1], GroupId::from_index(1));
    g.place(n[2], GroupId::from_index(1));
    g.place(n[3], GroupId::from_index(2));
    let graph = g.build().unwrap();
    let links: Vec<Option<u32>> = graph
        .plan
        .nodes
        .iter()
        .map(|s| s.chain_successor())
        .collect();
    // n0 (anywhere) -> n1 (group 1): checked at run time, not a link; n1 -> n2 same group: a
    // link; n2 -> n3 other group: not; n3 -> n4 (anywhere): a link.
    assert_eq!(links, vec![None, Some(2), None, Some(4), None]);
    assert_eq!(
        graph.plan.max_placement(),
        Some((3, GroupId::from_index(2)))
    );
    // Re-placing a node recomputes the highest placement.
    let mut g = GraphBuilder::<()>::new("replaced");
    let a = g.node("a", noop());
    let b = g.node("b", noop());
    g.place(a, GroupId::from_index(5));
    g.place(b, GroupId::from_index(1));
    g.place(a, GroupId::from_index(0));
    let graph = g.build().unwrap();
    assert_eq!(
        graph.plan.max_placement(),
        Some((1, GroupId::from_index(1)))
    );
    // A group index no pool can have is an error at build.
    let mut g = GraphBuilder::<()>::new("huge");
    let a = g.node("a", noop());
    g.place(a, GroupId::from_index(1 << 30));
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnknownGroup);
    assert!(err.to_string().contains("'a'"), "{err}");
}

#[test]
fn node_spec_stays_small() {
    // Building and running a large graph is mostly writing and reading these: keep them
    // at 24 bytes.
    assert_eq!(std::mem::size_of::<NodeSpec<()>>(), 24);
}

#[test]
fn empty_graph_plan() {
    let g = GraphBuilder::<()>::new("nothing").build().unwrap();
    assert!(g.plan.sources.is_empty() && g.plan.nodes.is_empty());
    assert_eq!(g.edge_count(), 0);
}

/// A node's release class says what releasing it needs without its record: one or two
/// predecessors, placed anywhere at the normal level; everything else reads the record.
#[test]
fn release_classes_follow_in_degree_placement_and_level() {
    use super::plan::{CLASS_ONE, CLASS_RECORD, CLASS_TWO};
    let mut g = GraphBuilder::<()>::new("g");
    let n: Vec<_> = (0..8).map(|i| g.node(format!("n{i}"), noop())).collect();
    // n1: one predecessor; n2: two; n3: three; n4: two, placed; n5: two, high; n6: one, low.
    g.edge(n[0], n[1]);
    g.edge(n[0], n[2]).edge(n[1], n[2]);
    g.edge(n[0], n[3]).edge(n[1], n[3]).edge(n[2], n[3]);
    g.edge(n[0], n[4]).edge(n[1], n[4]);
    g.place(n[4], GroupId::from_index(1));
    g.edge(n[0], n[5]).edge(n[1], n[5]);
    g.node_priority(n[5], Priority::High);
    g.edge(n[0], n[6]);
    g.node_priority(n[6], Priority::Low);
    g.edge(n[6], n[7]);
    let graph = g.build().unwrap();
    let classes: Vec<u8> = (0..8).map(|i| graph.plan.class(i)).collect();
    assert_eq!(
        classes,
        [
            CLASS_RECORD, // a source: no predecessor
            CLASS_ONE,
            CLASS_TWO,
            CLASS_RECORD,
            CLASS_RECORD,
            CLASS_RECORD,
            CLASS_RECORD,
            CLASS_ONE,
        ]
    );
}

/// A take of the wrong type fails, naming the type, and leaves the value where it was (a
/// `NodeRef` of the wrong type cannot be made outside the crate).
#[test]
fn a_take_of_another_type_leaves_the_value() {
    let pool = PoolBuilder::new()
        .workers(1)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    let mut g = GraphBuilder::new("types");
    let a = g.node("a", |_| Ok(String::from("four")));
    let b = g.node("b", move |ctx| {
        let wrong = NodeRef::<u64>::new(a.id());
        let e = ctx.take(wrong).unwrap_err();
        assert!(
            e.to_string().contains(
                "takes the output of node 'a' (#0), as u64, which is not its output type"
            ),
            "{e}"
        );
        Ok(ctx.take(a)?.len())
    });
    g.hand_on(a, b);
    assert_eq!(pool.run(&g.build().unwrap()).unwrap().get(b), Some(&4));
}

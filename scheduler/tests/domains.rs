//! Domains: a placement on a set of groups. A node placed on a domain runs on a worker of one
//! of its groups, never elsewhere, and every group of the domain takes part in a wide graph.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_scheduler::backend::FromIndex;
use boundpool_scheduler::{
    Cores, DomainId, ErrorKind, GraphBuilder, GroupId, GroupSpec, Placement, Pool, PoolBuilder,
};

/// Groups 0..3 form the domain "dev" (2 + 1 + 1 workers); group 3 ("host", 1 worker) is
/// outside it.
/// Three device groups (two workers in the first) under one domain `dev`, and a host group;
/// a worker's state is its group index.
fn domain_pool() -> Pool<usize> {
    PoolBuilder::new()
        .name("domains")
        .groups(vec![
            GroupSpec::new("dev.0", 2).cores(Cores::Unpinned),
            GroupSpec::new("dev.1", 1).cores(Cores::Unpinned),
            GroupSpec::new("dev.2", 1).cores(Cores::Unpinned),
            GroupSpec::new("host", 1).cores(Cores::Unpinned),
        ])
        .domain("dev", (0..3).map(GroupId::from_index))
        .start_hook(|info| Ok(info.group.index()))
        .build()
        .unwrap()
}

fn spin(d: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        std::hint::spin_loop();
    }
}

#[test]
fn pool_knows_its_domains() {
    let pool = domain_pool();
    let dev = pool.domain("dev").unwrap();
    assert_eq!(dev, DomainId::from_index(0));
    assert_eq!(pool.domain_count(), 1);
    assert_eq!(
        pool.domain_groups(dev),
        (0..3).map(GroupId::from_index).collect::<Vec<_>>()
    );
    assert!(pool.domain("nope").is_none());
}

/// A wide graph placed on the domain (source and sink too), entered from a node of the group
/// outside it: its middle nodes run on workers of every group of the domain, and no node of it
/// runs outside.
#[test]
fn domain_placed_wide_graph_uses_every_group_and_nothing_else() {
    let pool = domain_pool();
    let dev = pool.domain("dev").unwrap();
    let seen: Arc<Mutex<Vec<(usize, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut g = GraphBuilder::<usize>::new("wide");
    let record = |seen: &Arc<Mutex<Vec<(usize, usize)>>>, work: Duration| {
        let seen = seen.clone();
        move |ctx: &boundpool_scheduler::NodeCtx<'_, usize>| {
            spin(work);
            let group = *ctx.worker_state();
            assert_eq!(group, ctx.worker_info().group.index());
            seen.lock().unwrap().push((ctx.node_id().index(), group));
            Ok(())
        }
    };
    let entry = g.node("entry", record(&seen, Duration::ZERO));
    g.place(entry, GroupId::from_index(3));
    let src = g.node("src", record(&seen, Duration::ZERO));
    g.place(src, dev);
    g.edge(entry, src);
    let sink = g.node("sink", record(&seen, Duration::ZERO));
    g.place(sink, dev);
    for i in 0..400 {
        let n = g.node(format!("m{i}"), record(&seen, Duration::from_micros(30)));
        g.place(n, dev);
        g.edge(src, n).edge(n, sink);
    }
    let graph = g.build().unwrap();
    assert_eq!(graph.placement(src.id()), Some(Placement::Domain(dev)));
    let mut groups_seen = HashSet::new();
    for run in 0..20 {
        seen.lock().unwrap().clear();
        pool.run(&graph).unwrap();
        let s = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(s.len(), 403, "run {run}: every node ran once");
        for &(node, group) in &s {
            if node == entry.id().index() {
                assert_eq!(group, 3);
            } else {
                assert!(
                    group < 3,
                    "run {run}: node #{node} ran on group {group}, outside the domain"
                );
            }
        }
        groups_seen.extend(s.iter().map(|&(_, g)| g).filter(|&g| g < 3));
        if groups_seen.len() == 3 {
            break;
        }
    }
    assert_eq!(
        groups_seen.len(),
        3,
        "every group of the domain ran some of the wide graph's nodes: {groups_seen:?}"
    );
}

/// Independent domain-placed sources (from the submitter) and a domain node that follows a
/// group node inside the domain, or a domain node followed by group nodes.
#[test]
fn domain_sources_and_mixed_successors() {
    let pool = domain_pool();
    let dev = pool.domain("dev").unwrap();
    let mut g = GraphBuilder::<usize>::new("mixed");
    let mut sources = Vec::new();
    for i in 0..64 {
        let n = g.node(format!("s{i}"), |ctx| {
            spin(Duration::from_micros(20));
            Ok(*ctx.worker_state())
        });
        g.place(n, dev);
        sources.push(n);
    }
    // group 1 -> domain -> {group 2, host}
    let a = g.node("a", |ctx| Ok(*ctx.worker_state()));
    g.place(a, GroupId::from_index(1));
    let b = g.node("b", |ctx| Ok(*ctx.worker_state()));
    g.place(b, dev);
    let c = g.node("c", |ctx| Ok(*ctx.worker_state()));
    g.place(c, GroupId::from_index(2));
    let d = g.node("d", |ctx| Ok(*ctx.worker_state()));
    g.place(d, GroupId::from_index(3));
    g.edge(a, b).edge(b, c).edge(b, d);
    let graph = g.build().unwrap();
    for _ in 0..10 {
        let out = pool.run(&graph).unwrap();
        for s in &sources {
            assert!(*out.get(*s).unwrap() < 3);
        }
        assert_eq!(out.get(a), Some(&1));
        assert!(*out.get(b).unwrap() < 3);
        assert_eq!(out.get(c), Some(&2));
        assert_eq!(out.get(d), Some(&3));
    }
}

#[test]
fn bad_domains_are_errors() {
    let groups = || {
        vec![
            GroupSpec::new("a", 1).cores(Cores::Unpinned),
            GroupSpec::new("b", 1).cores(Cores::Unpinned),
        ]
    };
    let build = |b: PoolBuilder| b.build().map(|_| ()).unwrap_err();
    let e = build(
        PoolBuilder::new()
            .groups(groups())
            .domain("d", [GroupId::from_index(2)]),
    );
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(e.to_string().contains("domain 'd' names group 2"), "{e}");
    let e = build(PoolBuilder::new().groups(groups()).domain("d", []));
    assert!(e.to_string().contains("domain 'd' has no groups"), "{e}");
    let e = build(
        PoolBuilder::new()
            .groups(groups())
            .domain("d", [GroupId::from_index(0), GroupId::from_index(0)]),
    );
    assert!(e.to_string().contains("names group 'a' twice"), "{e}");
    let e = build(
        PoolBuilder::new()
            .groups(groups())
            .domain("d", [GroupId::from_index(0)])
            .domain("d", [GroupId::from_index(1)]),
    );
    assert!(e.to_string().contains("two domains are named 'd'"), "{e}");

    // A graph placed on a domain the pool lacks fails at submit, naming the node.
    let pool = PoolBuilder::new()
        .groups(groups())
        .domain("d", [GroupId::from_index(0), GroupId::from_index(1)])
        .build()
        .unwrap();
    let mut g = GraphBuilder::<()>::new("far");
    let n = g.node("n", |_| Ok(()));
    g.place(n, DomainId::from_index(1));
    let err = pool.submit(&g.build().unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnknownGroup);
    assert!(
        err.to_string().contains("'n'") && err.to_string().contains("domain 1"),
        "{err}"
    );
    // An index no pool can have is an error at build.
    let mut g = GraphBuilder::<()>::new("huge");
    let n = g.node("n", |_| Ok(()));
    g.place(n, DomainId::from_index(1 << 30));
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnknownGroup);
    assert!(err.to_string().contains("domain"), "{err}");
}

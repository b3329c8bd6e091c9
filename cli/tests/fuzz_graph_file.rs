//! Property tests of the graph-file reader (`boundpool::graph_file::parse`), and of
//! `boundpool run --graph` on the files it generates: arbitrary bytes, arbitrary JSON values, and
//! graph-file-like JSON (duplicate and unknown names, self and repeated edges, cycles, stray
//! fields, wrong types). Never a panic or a hang; a bad file is always an error with a short
//! message, and via the binary exit status 2 before anything runs. Case counts are small (CI has
//! 2 cores); `fuzz/` is the long-running fuzzer of the same reader.

use std::path::PathBuf;
use std::process::Command;

use boundpool::graph_file::parse;
use boundpool_workloads::Dag;
use proptest::prelude::*;
use serde_json::{json, Value};

/// The longest message the reader may give (names are cut at 64 characters, a whole message
/// at about 512 plus a note of what was left out).
const MESSAGE_LIMIT: usize = 1200;

/// What an accepted file must be: as many work figures as names, unique names, edges between
/// listed nodes, sorted, each once.
fn check_accepted(g: &boundpool::graph_file::GraphFile) {
    assert_eq!(g.names.len(), g.work_ns.len());
    let n = g.names.len() as u32;
    assert!(
        g.edges.iter().all(|&(a, b)| a < n && b < n),
        "{:?}",
        g.edges
    );
    assert!(g.edges.windows(2).all(|w| w[0] < w[1]), "{:?}", g.edges);
    let mut seen = std::collections::HashSet::new();
    assert!(g.names.iter().all(|s| seen.insert(s)), "{:?}", g.names);
}

/// Parses `text`; an error must be short. Returns the accepted graph.
fn parse_checked(text: &str) -> Option<boundpool::graph_file::GraphFile> {
    match parse(text, "prop") {
        Ok(g) => {
            check_accepted(&g);
            Some(g)
        }
        Err(m) => {
            assert!(!m.is_empty());
            assert!(
                m.len() <= MESSAGE_LIMIT,
                "a {}-byte message: {m:.300}",
                m.len()
            );
            None
        }
    }
}

/// Whether the scheduler accepts the graph (it can only reject a cycle).
fn builds(g: &boundpool::graph_file::GraphFile) -> bool {
    let dag = Dag {
        names: g.names.clone(),
        work_ns: vec![0; g.names.len()],
        edges: g.edges.clone(),
    };
    let mut b = boundpool::GraphBuilder::<()>::new("prop");
    let ids: Vec<_> = dag
        .names
        .iter()
        .map(|n| b.node(n.clone(), |_| Ok(())))
        .collect();
    for &(f, t) in &dag.edges {
        b.edge(ids[f as usize], ids[t as usize]);
    }
    match b.build() {
        Ok(_) => true,
        Err(e) => {
            assert_eq!(e.kind(), boundpool::ErrorKind::Cycle, "{e}");
            false
        }
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|x| json!(x)),
        "[a-z\\u{0}-\\u{7f}\\u{e9}\\u{1F600}]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("nodes".to_string()),
                        Just("edges".to_string()),
                        Just("name".to_string()),
                        Just("work_ns".to_string()),
                        "[a-z_]{1,8}",
                    ],
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A graph-file-like value: names from a small alphabet (so duplicates and cycles happen),
/// edges that may name unknown nodes, at times a stray field or a value of the wrong type.
fn graph_like() -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        4 => "[a-z]",
        4 => "n[0-9]{1,2}",
        1 => Just(String::new()),
        1 => "[\\u{e9}\\u{1F600}x]{1,3}",
    ];
    let node = (
        name.clone(),
        prop::option::of(any::<u16>()),
        0..48u8,
        json_value(),
    )
        .prop_map(|(n, w, twist, junk)| {
            let mut v = json!({"name": n});
            if let Some(w) = w {
                v["work_ns"] = json!(w);
            }
            match twist {
                0 => v["work_n"] = junk,
                1 => v["name"] = junk,
                2 => v["work_ns"] = json!(-1),
                _ => {}
            }
            v
        });
    // Edges name listed nodes by index (so cycles happen), at times an unknown one or junk.
    let edge = (any::<usize>(), any::<usize>(), 0..64u8, json_value());
    (
        prop::collection::vec(node, 0..12),
        prop::option::of(prop::collection::vec(edge, 0..20)),
        prop::option::of("[a-z]{0,6}"),
        0..32u8,
        json_value(),
    )
        .prop_map(|(nodes, edges, name, twist, junk)| {
            let name_of = |i: usize| {
                nodes
                    .get(i % nodes.len().max(1))
                    .and_then(|n| n.get("name"))
                    .cloned()
                    .unwrap_or_else(|| json!("ghost"))
            };
            let edges: Option<Vec<Value>> = edges.map(|es| {
                es.into_iter()
                    .map(|(a, b, twist, junk)| match twist {
                        0 => json!([name_of(a)]),
                        1 => json!([name_of(a), name_of(b), "c"]),
                        2 => junk,
                        3 => json!([name_of(a), "ghost"]),
                        4 | 5 => json!([name_of(a), name_of(a)]),
                        _ => json!([name_of(a), name_of(b)]),
                    })
                    .collect()
            });
            let mut v = json!({"nodes": nodes});
            if let Some(e) = edges {
                v["edges"] = json!(e);
            }
            if let Some(n) = name {
                v["name"] = json!(n);
            }
            match twist {
                0 => v["extra"] = junk,
                1 => v["nodes"] = junk,
                2 => v = junk,
                _ => {}
            }
            v
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        parse_checked(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn mangled_good_files_never_panic(cut in 0usize..200, insert in any::<u8>(), at in 0usize..200) {
        let good = r#"{"name": "g", "nodes": [{"name": "a", "work_ns": 5}, {"name": "b"}, {"name": "c"}], "edges": [["a", "b"], ["b", "c"]]}"#;
        let mut bytes = good.as_bytes().to_vec();
        bytes.truncate(cut.max(1).min(bytes.len()));
        let at = at.min(bytes.len());
        bytes.insert(at, insert);
        parse_checked(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn arbitrary_json_never_panics(v in json_value()) {
        parse_checked(&v.to_string());
    }

    #[test]
    fn graph_like_json_is_a_graph_or_a_short_error(v in graph_like()) {
        if let Some(g) = parse_checked(&v.to_string()) {
            builds(&g);
        }
    }

    #[test]
    fn huge_names_give_short_messages(len in 100usize..20_000, which in 0..4u8) {
        let long = "\u{e9}".repeat(len);
        let text = match which {
            0 => format!(r#"{{"nodes": [{{"name": "{long}"}}, {{"name": "{long}"}}]}}"#),
            1 => format!(r#"{{"nodes": [{{"name": "a"}}], "edges": [["a", "{long}"]]}}"#),
            2 => format!(r#"{{"nodes": [{{"name": "a", "{long}": 1}}]}}"#),
            _ => format!(r#"{{"nodes": [{{"name": ["{long}"]}}]}}"#),
        };
        prop_assert!(parse_checked(&text).is_none());
    }
}

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("boundpool-fuzz-file-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

proptest! {
    // Each case starts the binary: a few dozen keep this to about a second.
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn the_binary_exits_2_with_a_short_message_for_every_bad_file(v in graph_like(), k in any::<u64>()) {
        let text = v.to_string();
        let verdict = parse(&text, "prop").map(|g| builds(&g));
        let f = scratch().join(format!("case-{k}.json"));
        std::fs::write(&f, &text).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_boundpool"))
            .args(["run", "--graph", f.to_str().unwrap(), "--threads", "2", "--json"])
            .output()
            .expect("the binary starts");
        let _ = std::fs::remove_file(&f);
        let _ = std::fs::remove_dir(f.parent().unwrap()); // empty now: leave nothing in /tmp
        let stderr = String::from_utf8_lossy(&o.stderr);
        match verdict {
            Ok(true) => prop_assert!(o.status.success(), "a good file failed: {text}\n{stderr}"),
            Ok(false) | Err(_) => {
                prop_assert_eq!(o.status.code(), Some(2), "{}\n{}", text, stderr);
                prop_assert!(o.stdout.is_empty(), "no summary for a bad file");
                prop_assert!(stderr.len() < MESSAGE_LIMIT + 300, "{} bytes: {stderr:.300}", stderr.len());
                prop_assert!(stderr.contains("bad graph file"), "{stderr}");
            }
        }
    }
}

/// The generator must reach the scheduler's validation and the runs, not only the reader's
/// errors: of 300 values, a fair share are accepted files, some of them with a cycle.
#[test]
fn graph_like_values_are_often_graphs() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut accepted, mut cyclic) = (0, 0);
    for _ in 0..300 {
        let v = graph_like().new_tree(&mut runner).unwrap().current();
        if let Some(g) = parse_checked(&v.to_string()) {
            accepted += 1;
            cyclic += usize::from(!builds(&g));
        }
    }
    eprintln!("{accepted} of 300 accepted, {cyclic} of them with a cycle");
    assert!(
        accepted >= 30 && cyclic >= 3,
        "{accepted} accepted, {cyclic} with a cycle"
    );
}

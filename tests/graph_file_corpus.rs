//! Replays the fuzzer's seeded corpus (`fuzz/corpus/graph_file/`) through the graph-file reader
//! and the scheduler's validation, as the fuzz target does: no panic, a short message for every
//! rejected file, and the files a user would write first behave as the README says.

use std::path::Path;

use boundpool::graph_file::parse;

#[test]
fn every_corpus_file_is_a_graph_or_a_short_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/graph_file");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "the seeded corpus is there: {files:?}");
    let (mut accepted, mut rejected, mut cycles) = (0, 0, 0);
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue; // the command line rejects it when reading
        };
        match parse(text, "corpus") {
            Err(m) => {
                assert!(
                    m.len() <= 1200,
                    "{}: a {}-byte message",
                    f.display(),
                    m.len()
                );
                rejected += 1;
            }
            Ok(g) => {
                accepted += 1;
                let mut b = boundpool::GraphBuilder::<()>::new(g.name.clone());
                let ids: Vec<_> = g
                    .names
                    .iter()
                    .map(|n| b.node(n.clone(), |_| Ok(())))
                    .collect();
                for &(x, y) in &g.edges {
                    b.edge(ids[x as usize], ids[y as usize]);
                }
                if let Err(e) = b.build() {
                    assert_eq!(
                        e.kind(),
                        boundpool::ErrorKind::Cycle,
                        "{}: {e}",
                        f.display()
                    );
                    cycles += 1;
                }
            }
        }
    }
    eprintln!(
        "{} files: {accepted} accepted ({cycles} with a cycle), {rejected} rejected",
        files.len()
    );
    let seed = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    assert!(parse(&seed("empty.json"), "e").unwrap().names.is_empty());
    assert!(parse(&seed("pipeline.json"), "p").is_ok());
    assert!(parse(&seed("duplicate.json"), "d")
        .unwrap_err()
        .contains("duplicate node name"));
    assert!(parse(&seed("typo.json"), "t")
        .unwrap_err()
        .contains("unknown field"));
}

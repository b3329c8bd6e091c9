//! A graph in Graphviz DOT, for looking at it.

use crate::graph::Graph;
use crate::ids::{GroupId, Placement};

impl<S> Graph<S> {
    /// The graph in Graphviz DOT: nodes labelled with their name and placement
    /// (`host` or the group's name from `group_name`, `cpu lane` for CPU-heavy nodes).
    pub fn to_dot_with(&self, group_name: impl Fn(GroupId) -> String) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "digraph \"{}\" {{", dot_escape(&self.plan.name));
        let _ = writeln!(s, "  node [shape=box, style=rounded];");
        for (i, spec) in self.plan.nodes.iter().enumerate() {
            let place = if spec.is_cpu() {
                "cpu lane".to_string()
            } else {
                match spec.placement() {
                    Placement::Any => "host".to_string(),
                    Placement::Group(g) => group_name(g),
                    Placement::Domain(d) => format!("domain {}", d.index()),
                }
            };
            let _ = writeln!(
                s,
                "  n{i} [label=\"{}\\n[{}]\"];",
                dot_escape(&self.plan.names[i]),
                dot_escape(&place)
            );
        }
        for i in 0..self.plan.nodes.len() as u32 {
            for &j in self.plan.successors(i) {
                let _ = writeln!(s, "  n{i} -> n{j};");
            }
        }
        s.push_str("}\n");
        s
    }

    /// [`to_dot_with`](Self::to_dot_with) naming groups `group N`.
    pub fn to_dot(&self) -> String {
        self.to_dot_with(|g| format!("group {}", g.index()))
    }
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

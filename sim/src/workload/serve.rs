//! The served model at C clients: each client sends requests back to back. A request is the
//! client's own time between requests (its thread returning from the wait, checking the
//! answer, submitting the next: a host node on a group of client threads, one worker a
//! client, as the real clients are threads of their own) and then the request graph's nodes
//! in order on the GPU workers (in the real bench a replay: host nodes and graph segments).

use crate::graph::{NodeSpec, SimGraph};

/// One node of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestStep {
    /// Its kind (the cost model's key).
    pub kind: String,
    /// A GPU node (its body launches device work) or a host node.
    pub gpu: bool,
}

impl RequestStep {
    /// A node of `kind`, on the GPU or not.
    pub fn new(kind: impl Into<String>, gpu: bool) -> Self {
        RequestStep {
            kind: kind.into(),
            gpu,
        }
    }
}

/// The served model's run.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeSpec {
    /// Clients.
    pub clients: usize,
    /// Requests per client.
    pub requests: usize,
    /// The group of client threads (its workers: one per client).
    pub client_group: usize,
    /// The group of GPU workers.
    pub gpu_group: usize,
    /// The kind of the client's time between a request's end and the next one's first node.
    pub client_kind: String,
    /// A request's nodes, each after the one before: a GPU node after a GPU node waits on the
    /// device, a host node after a GPU node for its device work.
    pub steps: Vec<RequestStep>,
}

/// Every client's chain of requests: request `i = c × requests + k` of client `c` is
/// `CLIENT_KIND i` on the client group, then `STEP i` for each step, then the client's next
/// request.
pub fn serve(spec: &ServeSpec) -> SimGraph {
    let mut g = SimGraph::new(format!("served model, {} clients", spec.clients));
    for c in 0..spec.clients {
        let mut prev: Option<u32> = None;
        for k in 0..spec.requests {
            let i = c * spec.requests + k;
            let client = std::iter::once((&spec.client_kind, false, spec.client_group));
            let steps = spec.steps.iter().map(|s| (&s.kind, s.gpu, spec.gpu_group));
            for (kind, gpu, group) in client.chain(steps) {
                let node = if gpu {
                    NodeSpec::gpu(kind.clone())
                } else {
                    NodeSpec::host(kind.clone())
                };
                let x = g.node(format!("{kind} {i}"), 0, node.group(group));
                if let Some(p) = prev {
                    g.edge(p, x);
                }
                prev = Some(x);
            }
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_per_client() {
        let g = serve(&ServeSpec {
            clients: 2,
            requests: 3,
            client_group: 1,
            gpu_group: 0,
            client_kind: "client".into(),
            steps: vec![
                RequestStep::new("stage", false),
                RequestStep::new("fwd", true),
            ],
        });
        assert_eq!(g.nodes.len(), 2 * 3 * 3);
        assert_eq!(g.desc.edges.len(), 2 * (3 * 3 - 1));
        assert_eq!(g.desc.nodes[3].name, "client 1");
        assert_eq!(g.nodes[3].group, 1);
        assert!(g.nodes[5].gpu && g.nodes[5].group == 0);
        assert_eq!(g.desc.nodes[9].name, "client 3");
    }
}

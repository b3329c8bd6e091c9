//! The served model at C clients: each client sends requests back to back, a request being
//! the client's own host work (prepare, submit, wait, check) and the model's forward pass, one
//! GPU node (a replayed CUDA graph in the real bench). As a graph: per client a chain of
//! requests, the client's work on a group of client threads (one worker a client, as the
//! real clients are threads of their own), the forward pass on the GPU workers.

use crate::graph::{NodeSpec, SimGraph};

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
    /// The forward pass's kind (its GPU node's name in the trace).
    pub forward_kind: String,
    /// The client's host work's kind.
    pub client_kind: String,
}

/// Every client's chain of requests: request `k` of client `c` is `client i` (host, kind
/// `client_kind`) then `forward i` (GPU, kind `forward_kind`), `i = c × requests + k`, then
/// the client's next request.
pub fn serve(spec: &ServeSpec) -> SimGraph {
    let mut g = SimGraph::new(format!("served model, {} clients", spec.clients));
    for c in 0..spec.clients {
        let mut prev: Option<u32> = None;
        for k in 0..spec.requests {
            let client = g.node(
                format!("{} {}", spec.client_kind, c * spec.requests + k),
                0,
                NodeSpec::host(spec.client_kind.clone()).group(spec.client_group),
            );
            if let Some(p) = prev {
                g.edge(p, client);
            }
            let fwd = g.node(
                format!("{} {}", spec.forward_kind, c * spec.requests + k),
                0,
                NodeSpec::gpu(spec.forward_kind.clone()).group(spec.gpu_group),
            );
            g.edge(client, fwd);
            prev = Some(fwd);
        }
    }
    g
}

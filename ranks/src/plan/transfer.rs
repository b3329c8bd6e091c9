//! A value crossing ranks: what the lowering makes of a cross-rank edge, and what the NCCL
//! order and the runtime read.

/// One value crossing ranks once per run: `producer`'s output, from its rank (or a rank that
/// received it and forwards it, `via`) to `to`, read there by `consumers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The producing node.
    pub producer: u32,
    /// The sending rank: the producer's, or the relay's where [`via`](Self::via) is set.
    pub from: usize,
    /// The consuming rank (the receiver).
    pub to: usize,
    /// Position among the transfers from `from` to `to` (0, 1, …, in producer order): with the
    /// run's slot it picks the message's tag.
    pub index: u32,
    /// The nodes on `to` that read the value, ascending.
    pub consumers: Vec<u32>,
    /// How urgent the value is on `to`: the number of nodes on the longest path from its
    /// consumers there to the end of the graph (their largest bottom level). A rank with
    /// several values waiting to be sent should send the most urgent first (what that pays
    /// where the links are the limit: docs/benchmarks.md, "A cluster on paper").
    pub priority: u32,
    /// The transfer whose received value `from` forwards (a relay, see `plan::relay`), or
    /// `None` where the producer's rank sends it.
    pub via: Option<u32>,
}

//! Registration at rank 0 and its verdict: the ranks' graphs compared (digests), tags given,
//! or the first difference named.

use super::*;

impl<T: Transport> Engine<T> {
    pub(super) fn registered(&mut self, gid: u32, from: usize, reg: Reg) {
        let size = self.size;
        let regs = self
            .regs
            .entry(gid)
            .or_insert_with(|| (0..size).map(|_| None).collect());
        regs[from] = Some(reg);
        if regs.iter().any(Option::is_none) {
            return;
        }
        let regs = self.regs.remove(&gid).expect("complete");
        let first = regs[0].as_ref().expect("complete");
        let mismatch = regs.iter().enumerate().skip(1).find_map(|(r, reg)| {
            let reg = reg.as_ref().expect("complete");
            let diff = if reg.name != first.name {
                Some(None)
            } else {
                first_difference(&first.digest, &reg.digest)
            };
            let relays = diff.is_none() && reg.digest.relay != first.digest.relay;
            diff.or(relays.then_some(None)).map(|node| Mismatch {
                rank: r as u32,
                node: node.map(|i| i as u32),
                name_on_0: None,
                graph_on_0: first.name.clone(),
                relays,
            })
        });
        let result = match mismatch {
            Some(mut m) => {
                m.name_on_0 = m.node.and_then(|i| {
                    self.graphs
                        .get(&gid)
                        .and_then(|g| g.graph.as_ref())
                        .and_then(|g| g.node_names.get(i as usize).cloned())
                });
                Err(m)
            }
            None => {
                let base = self.next_tag;
                let end = base + first.tags;
                if end > u64::from(self.t.max_tag()) + 1 {
                    Err(Mismatch {
                        rank: u32::MAX,
                        node: None,
                        name_on_0: Some(format!(
                            "needs {} tags, and {} of the transport's {} are left",
                            first.tags,
                            (u64::from(self.t.max_tag()) + 1).saturating_sub(base),
                            self.t.max_tag()
                        )),
                        graph_on_0: first.name.clone(),
                        relays: false,
                    })
                } else {
                    self.next_tag = end;
                    Ok(base as u32)
                }
            }
        };
        let msg = Control::Verdict { gid, result };
        self.broadcast(&msg);
        if let Control::Verdict { result, .. } = msg {
            self.verdict(gid, result);
        }
    }

    pub(super) fn mismatch_error(&self, gid: u32, m: &Mismatch) -> Error {
        let gs = self.graphs.get(&gid);
        let name = gs
            .and_then(|g| g.graph.as_ref())
            .map_or("?", |g| g.name.as_str());
        if m.rank == u32::MAX {
            return Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "graph '{}' {} (MPI_TAG_UB); fewer runs in flight or fewer transfers per pair of ranks need fewer",
                    crate::error::bounded(name),
                    m.name_on_0.as_deref().unwrap_or("needs more tags")
                ),
            );
        }
        let here = if self.rank == m.rank as usize {
            m.node
                .and_then(|i| {
                    gs.and_then(|g| g.graph.as_ref())
                        .map(|g| match g.node_names.get(i as usize) {
                            Some(n) => format!(" (here: '{}')", crate::error::bounded(n)),
                            None => " (here: no such node)".to_string(),
                        })
                })
                .unwrap_or_default()
        } else {
            String::new()
        };
        let msg = match (m.node, &m.name_on_0) {
            _ if m.relays => format!(
                "graph '{}' differs between ranks: rank {} relays values on another host map \
                 than rank 0 (or relays where rank 0 does not): RanksBuilder::hosts and \
                 RanksBuilder::relay_per_host must agree on every rank",
                crate::error::bounded(&m.graph_on_0),
                m.rank
            ),
            (Some(i), Some(n0)) => format!(
                "graph '{}' differs between ranks: node #{i} is '{}' on rank 0 but differs on rank {}{here} (its name, rank, wire, output type or inputs)",
                crate::error::bounded(&m.graph_on_0),
                crate::error::bounded(n0),
                m.rank
            ),
            (Some(i), None) => format!(
                "graph '{}' differs between ranks: rank 0's graph has no node #{i}, rank {}'s has{here}",
                crate::error::bounded(&m.graph_on_0),
                m.rank
            ),
            (None, _) => format!(
                "graph '{}' (first submitted as graph #{gid} here) differs between ranks: rank {} has another name, node count or runs in flight{}",
                crate::error::bounded(&m.graph_on_0),
                m.rank,
                if self.rank == m.rank as usize { format!(" (here: '{}')", crate::error::bounded(name)) } else { String::new() }
            ),
        };
        let mut e = Error::new(ErrorKind::GraphMismatch, msg).at_rank(m.rank as usize);
        if let Some(n) = &m.name_on_0 {
            e = e.at_node(n.clone());
        }
        e
    }

    pub(super) fn verdict(&mut self, gid: u32, result: Result<u32, Mismatch>) {
        match result {
            Ok(base) => {
                let gs = self.graphs.entry(gid).or_default();
                let graph = gs
                    .graph
                    .clone()
                    .expect("a verdict follows our registration");
                let layout = TagLayout {
                    base,
                    slots: graph.runs_in_flight,
                    per_run: graph.tags_per_run,
                };
                gs.layout = Some(layout);
                graph.publish_layout(layout);
                if TagLayout::size(layout.slots, layout.per_run) > 0 {
                    self.ranges.insert(base, gid);
                }
                let held = std::mem::take(&mut gs.held);
                for (run, k, payload) in held {
                    self.post_or_queue(layout, run, k, payload);
                }
                self.remap_unmapped();
            }
            Err(m) => {
                let e = self.mismatch_error(gid, &m);
                let gs = self.graphs.entry(gid).or_default();
                gs.refused = Some(e.clone());
                for (run, k, _) in std::mem::take(&mut gs.held) {
                    run.sends[k as usize].fail(e.clone());
                }
                for run in gs.active.values() {
                    run.cancel(&e);
                }
            }
        }
        // Runs that ended everywhere before the verdict came resolve now.
        let ended: Vec<u64> = self.graphs[&gid]
            .active
            .iter()
            .filter(|(_, r)| r.is_local_done())
            .map(|(&s, _)| s)
            .collect();
        for seq in ended {
            self.try_resolve(gid, seq);
        }
    }
}

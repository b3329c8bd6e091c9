//! In-place writes in a replay graph: a node takes a predecessor's output by value
//! ([`ReplayCtx::take`]) when it is that output's only reader, and the rules for which nodes may
//! ([`refusal`]: checked by [`ReplayBuilder::build`](super::ReplayBuilder::build) for edges
//! declared with [`ReplayBuilder::hand_on`](super::ReplayBuilder::hand_on), by the take itself
//! for the others, so that eager and replayed runs of a graph refuse the same takes).
//!
//! Replayed, a captured node's output is the instance's: its body returned it at the capture
//! and every replay writes it again. A captured node takes a captured predecessor's output of
//! its own segment at the capture, from the capture's outputs, so that its body writes into
//! that buffer and hands it on (its output), and the instance keeps the buffer once, as the
//! taker's output: the CUDA graph writes it in place at every replay. Other pairs would give a
//! value to a body that runs at another rate than the value's maker (a captured taker of a
//! host node's output would take one run's value; a host taker of a captured output would take
//! the instance's buffer that the next replay writes), or a value shared by construction (a
//! run's input), so they are refused by name.

use std::sync::Arc;

use boundpool_scheduler::NodeRef;

use crate::error::{GpuError, GpuErrorKind, GpuResult};

use super::desc::{Desc, Kind, Out, RNode, ReplayCtx, Source};

/// What a node is, for the take rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// A captured GPU node, in its segment.
    Captured(u32),
    /// A host node or an eager GPU node: run every time.
    PerRun,
    /// An input node: each run brings its value.
    Input,
}

impl Desc {
    pub(super) fn role(&self, i: u32) -> Role {
        match self.kinds[i as usize] {
            Kind::Captured(_) => Role::Captured(self.seg_of[i as usize].expect("captured")),
            Kind::Eager(_) | Kind::Host => Role::PerRun,
            Kind::Input(_) => Role::Input,
        }
    }

    /// "node 'name'".
    pub(super) fn label(&self, i: u32) -> String {
        format!("node '{}'", self.names[i as usize])
    }

    /// Why `to` may not take `from`'s output ([`refusal`]), for a direct successor `to`.
    pub(super) fn take_refusal(&self, from: u32, to: u32) -> Option<String> {
        refusal(
            from,
            to,
            &self.succs[from as usize],
            |i| self.role(i),
            |i| self.label(i),
        )
    }
}

/// Why node `to`, a direct successor of `from` (whose successors are `succs`), may not take
/// `from`'s output, or `None` if it may: the end of an error that begins "node 'to' takes the
/// output of node 'from', ". `role` and `label` describe and name a node.
pub(super) fn refusal(
    from: u32,
    to: u32,
    succs: &[u32],
    role: impl Fn(u32) -> Role,
    label: impl Fn(u32) -> String,
) -> Option<String> {
    if let Some(&other) = succs.iter().find(|&&s| s != to) {
        return Some(format!(
            "which {} may also read (of {} successors): a node takes an output only as its only \
             successor",
            label(other),
            succs.len()
        ));
    }
    match (role(from), role(to)) {
        (Role::Input, _) => Some(
            "an input node: its value is the run's, shared with the caller's RunInputs and the \
             run's ReplayOutput (read it with input)"
                .into(),
        ),
        (Role::PerRun, Role::Captured(_)) => Some(format!(
            "a host or eager node, run every time, while {} is captured (its body runs at a \
             capture only, so it would take one run's value): a captured node takes only \
             captured nodes' outputs",
            label(to)
        )),
        (Role::Captured(_), Role::PerRun) => Some(
            "a captured node, whose output the replay instance keeps and every replay writes \
             (read it with input): a host or eager node takes only host or eager nodes' outputs"
                .into(),
        ),
        (Role::Captured(a), Role::Captured(b)) if a != b => Some(format!(
            "captured in segment {a}, {} in segment {b} (a host, eager or input node on a path \
             into it, or another device, cuts them apart): a captured node takes only from its \
             own segment",
            label(to)
        )),
        _ => None,
    }
}

impl ReplayCtx<'_, '_> {
    /// Takes the output of direct predecessor `from` by value, to write into it in place (a
    /// buffer given to cuBLAS as `c`, a kernel's output, a memset) without a lock or a raw
    /// address, and hand it on as this node's output. **This node must be `from`'s only
    /// successor**, and the two must run at the same rate: both captured, in one segment, or
    /// both host or eager nodes (never from an input node). Declare the edge with
    /// [`ReplayBuilder::hand_on`](super::ReplayBuilder::hand_on) to have `build` check it;
    /// otherwise it is checked here, in eager and replayed runs alike.
    ///
    /// Eagerly (an eager run, or a host or eager node) the value is the one `from` made in this
    /// run. Under a capture it is the one `from`'s body returned at this capture, and what this
    /// body returns (the buffer, written) is what the instance keeps: every replay writes the
    /// same buffer in place, `update` captures both bodies again and the taker gets the new
    /// buffer. Either way `from` has no output afterwards: [`ReplayOutput::get`] gives `None`
    /// for it. (A taker that drops a `DeviceBuffer` under a capture fails the capture, as any
    /// free there does: return it.)
    ///
    /// Errors ([`GpuErrorKind::InvalidArgument`], naming both nodes): `from` is not a direct
    /// predecessor, or has another successor (named), or the pair is one of those above; this
    /// node read it with [`input`](Self::input) or took it before.
    ///
    /// [`ReplayOutput::get`]: super::ReplayOutput::get
    pub fn take<T: Send + Sync + 'static>(&self, from: RNode<T>) -> GpuResult<T> {
        let desc = self.desc;
        let bad = |why: &str| {
            let of = if from.graph != desc.uid || from.idx as usize >= desc.names.len() {
                format!("node #{} of another replay graph", from.idx)
            } else {
                desc.label(from.idx)
            };
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "node '{}' of replay graph '{}' takes the output of {of}, {why}",
                    self.node_name(),
                    desc.name,
                ),
            )
        };
        if from.graph != desc.uid || !desc.preds[self.me as usize].contains(&from.idx) {
            return Err(bad("which is not a direct predecessor"));
        }
        if let Some(why) = desc.take_refusal(from.idx, self.me) {
            return Err(bad(&why));
        }
        let sched = |refs: &[Option<NodeRef<Out>>]| -> GpuResult<Out> {
            let r = refs
                .get(from.idx as usize)
                .copied()
                .flatten()
                .ok_or_else(|| bad("which has no node in this run"))?;
            self.node
                .take(r)
                .map_err(|e| bad(&format!("refused: {e}")).with_source(e))
        };
        let out = match &self.src {
            Source::Eager(refs) => sched(refs)?,
            Source::Replay { refs, capture, .. } => match capture {
                // Both captured, in one segment (`take_refusal`): this capture's value, in
                // `local` once `from` ran (members run in a topological order).
                Some((_, local)) if desc.captured(from.idx) => {
                    let taken = local.borrow_mut()[from.idx as usize].take();
                    taken.ok_or_else(|| bad("which it took before"))?
                }
                _ if desc.captured(from.idx) => return Err(bad("outside a capture")),
                _ => sched(refs)?,
            },
        };
        let typed = out
            .downcast::<T>()
            .map_err(|_| bad("which is not of the type asked for"))?;
        // One owner: a value is stored once (`Arc::new` of the body's value) and only its
        // readers' `input` or a capture's hold (a reader outside the segment) clone it, and
        // this node is the only reader.
        Arc::try_unwrap(typed).map_err(|_| bad("which something else still holds"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes 0..: `roles[i]`, named n0, n1, ...
    fn why(from: u32, to: u32, succs: &[u32], roles: &[Role]) -> Option<String> {
        refusal(
            from,
            to,
            succs,
            |i| roles[i as usize],
            |i| format!("node 'n{i}'"),
        )
    }

    #[test]
    fn a_node_takes_only_as_the_only_successor_at_its_own_rate() {
        use Role::*;
        // Allowed: captured from captured of one segment, per-run from per-run.
        assert_eq!(why(0, 1, &[1], &[Captured(2), Captured(2)]), None);
        assert_eq!(why(0, 1, &[1], &[PerRun, PerRun]), None);
        let two = why(0, 1, &[1, 2], &[PerRun, PerRun, PerRun]).unwrap();
        assert!(
            two.starts_with("which node 'n2' may also read (of 2 successors)"),
            "{two}"
        );
        let input = why(0, 1, &[1], &[Input, PerRun]).unwrap();
        assert!(input.starts_with("an input node"), "{input}");
        let at_capture = why(0, 1, &[1], &[PerRun, Captured(0)]).unwrap();
        assert!(
            at_capture.contains("while node 'n1' is captured")
                && at_capture.contains("takes only captured nodes' outputs"),
            "{at_capture}"
        );
        let kept = why(0, 1, &[1], &[Captured(0), PerRun]).unwrap();
        assert!(
            kept.starts_with("a captured node, whose output the replay instance keeps"),
            "{kept}"
        );
        let apart = why(0, 1, &[1], &[Captured(0), Captured(1)]).unwrap();
        assert!(
            apart.starts_with("captured in segment 0, node 'n1' in segment 1"),
            "{apart}"
        );
        // Another successor is named first, whatever the roles.
        let both = why(0, 1, &[2, 1], &[Input, PerRun, PerRun]).unwrap();
        assert!(both.starts_with("which node 'n2'"), "{both}");
    }
}

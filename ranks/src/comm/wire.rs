//! What ranks say to each other besides data: control messages (postcard, on tag 0) and the
//! layout of data tags.

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind};

/// The tag of control messages.
pub(crate) const CONTROL_TAG: u32 = 0;
/// The first data tag; a graph's range starts at the base its verdict gives.
pub(crate) const FIRST_DATA_TAG: u32 = 1;

/// Data tags of one graph: `2 × runs_in_flight × tags_per_run`, from `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TagLayout {
    pub(crate) base: u32,
    pub(crate) slots: u32,
    pub(crate) per_run: u32,
}

impl TagLayout {
    /// Tags a graph needs.
    pub(crate) fn size(slots: u32, per_run: u32) -> u64 {
        2 * u64::from(slots) * u64::from(per_run)
    }

    /// The tag of transfer `index` (of its pair) in run slot `slot`; `long`: the header and
    /// chunks of a value past the message limit.
    pub(crate) fn tag(&self, slot: u32, index: u32, long: bool) -> u32 {
        self.base + 2 * (slot * self.per_run + index) + u32::from(long)
    }

    /// (slot, index, long) of a tag in this layout.
    pub(crate) fn decode(&self, tag: u32) -> Option<(u32, u32, bool)> {
        let rel = tag.checked_sub(self.base)?;
        if u64::from(rel) >= Self::size(self.slots, self.per_run) {
            return None;
        }
        let q = rel / 2;
        Some((q / self.per_run, q % self.per_run, rel % 2 == 1))
    }
}

/// Bytes after a value on the posted lane: its graph, transfer and run, since a lane's
/// messages carry no tag and may pass the sender's control messages. At the end, so that a
/// value's bytes, copied with room for it, take it without another copy.
pub(crate) const LANE_TRAILER: usize = 16;

/// What a value's message on the posted lane (`Transport::lane_send`) says of itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LaneTrailer {
    /// The graph (the same id on every rank: graphs are registered in one order).
    pub(crate) gid: u32,
    /// The transfer's index among those of its pair of ranks.
    pub(crate) index: u32,
    /// The run.
    pub(crate) seq: u64,
}

impl LaneTrailer {
    /// Makes `value` the lane's message: appends this trailer.
    pub(crate) fn append_to(&self, value: &mut Vec<u8>) {
        value.reserve_exact(LANE_TRAILER);
        value.extend_from_slice(&self.gid.to_le_bytes());
        value.extend_from_slice(&self.index.to_le_bytes());
        value.extend_from_slice(&self.seq.to_le_bytes());
    }

    /// The trailer and the value of a lane message; `None` if it is too short to have one.
    pub(crate) fn split(message: &[u8]) -> Option<(Self, &[u8])> {
        let at = message.len().checked_sub(LANE_TRAILER)?;
        let (value, t) = message.split_at(at);
        let word = |i: usize| u32::from_le_bytes(t[i..i + 4].try_into().expect("4 bytes"));
        Some((
            LaneTrailer {
                gid: word(0),
                index: word(4),
                seq: u64::from_le_bytes(t[8..16].try_into().expect("8 bytes")),
            },
            value,
        ))
    }
}

/// Why a node failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum FailKind {
    /// Its body returned an error.
    Failed,
    /// Its body panicked.
    Panicked,
    /// A value it receives could not be decoded (a receive node).
    Decode,
}

/// A node failure at its root: the rank and node where it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Failure {
    pub(crate) rank: u32,
    pub(crate) node: u32,
    pub(crate) node_name: String,
    pub(crate) graph: String,
    pub(crate) message: String,
    pub(crate) kind: FailKind,
}

impl Failure {
    /// The error every rank's `wait` returns for it.
    pub(crate) fn to_error(&self) -> Error {
        let (kind, verb) = match self.kind {
            FailKind::Failed => (ErrorKind::NodeFailed, "failed"),
            FailKind::Panicked => (ErrorKind::NodePanicked, "panicked"),
            FailKind::Decode => (ErrorKind::Decode, "failed"),
        };
        Error::new(
            kind,
            format!(
                "rank {}: node '{}' (#{}) of graph '{}' {verb}: {}",
                self.rank,
                crate::error::bounded(&self.node_name),
                self.node,
                crate::error::bounded(&self.graph),
                crate::error::bounded(&self.message)
            ),
        )
        .at_rank(self.rank as usize)
        .at_node(self.node_name.clone())
    }
}

/// How a run ended on one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// Every node ran.
    Done,
    /// A node of this rank failed.
    Failed(Failure),
    /// It was cancelled by another rank's failure, a graph mismatch or a dead peer.
    Cancelled,
}

/// The first difference rank 0 found between the ranks' graphs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Mismatch {
    /// The rank whose graph differs from rank 0's.
    pub(crate) rank: u32,
    /// The first node that differs (`None`: only the graph's name, size or runs in flight).
    pub(crate) node: Option<u32>,
    /// Rank 0's name of that node (`None`: rank 0's graph has no such node).
    pub(crate) name_on_0: Option<String>,
    /// Rank 0's graph name.
    pub(crate) graph_on_0: String,
    /// Only how the ranks relay differs (`Digest::relay`: the host map, or relaying on or off).
    pub(crate) relays: bool,
}

/// A control message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Control {
    /// To rank 0, at a graph's first submission: its structure digest.
    Register {
        gid: u32,
        name: String,
        graph: u64,
        nodes: Vec<u64>,
        relay: u64,
        tags: u64,
    },
    /// From rank 0 to all: the ranks' graphs match (here is the graph's first tag), or not.
    Verdict {
        gid: u32,
        result: Result<u32, Mismatch>,
    },
    /// To all, once a run ends here: how.
    Status {
        gid: u32,
        seq: u64,
        outcome: Outcome,
    },
    /// To all, as soon as a node fails here: cancel the run.
    Fail {
        gid: u32,
        seq: u64,
        failure: Failure,
    },
    /// To all, every heartbeat period: still alive.
    Heartbeat,
    /// To all, when the runtime shuts down normally.
    Bye,
    /// To all, when the process is going down with a panic outside a node.
    Died { reason: String },
}

impl Control {
    pub(crate) fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("control messages encode")
    }

    pub(crate) fn decode(bytes: &[u8], from: usize) -> Result<Self, Error> {
        postcard::from_bytes(bytes).map_err(|e| {
            Error::new(
                ErrorKind::Transport,
                format!("a control message from rank {from} does not decode: {e} (are all ranks the same build?)"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_stay_in_range() {
        let l = TagLayout {
            base: 11,
            slots: 3,
            per_run: 5,
        };
        let mut seen = std::collections::HashSet::new();
        for slot in 0..3 {
            for index in 0..5 {
                for long in [false, true] {
                    let t = l.tag(slot, index, long);
                    assert!(seen.insert(t));
                    assert_eq!(l.decode(t), Some((slot, index, long)));
                }
            }
        }
        assert_eq!(seen.len() as u64, TagLayout::size(3, 5));
        assert_eq!(l.decode(10), None);
        assert_eq!(l.decode(11 + 30), None);
    }

    #[test]
    fn lane_messages_carry_their_graph_transfer_and_run() {
        let t = LaneTrailer {
            gid: 3,
            index: 70_000,
            seq: u64::MAX - 1,
        };
        let mut m = vec![5u8, 6, 7];
        t.append_to(&mut m);
        assert_eq!(m.len(), 3 + LANE_TRAILER);
        assert_eq!(LaneTrailer::split(&m), Some((t, &[5u8, 6, 7][..])));
        let mut empty = Vec::new();
        t.append_to(&mut empty);
        assert_eq!(LaneTrailer::split(&empty), Some((t, &[][..])));
        assert_eq!(LaneTrailer::split(&m[..LANE_TRAILER - 1]), None);
    }

    #[test]
    fn control_messages_round_trip() {
        let m = Control::Fail {
            gid: 2,
            seq: 9,
            failure: Failure {
                rank: 1,
                node: 4,
                node_name: "b".into(),
                graph: "g".into(),
                message: "boom".into(),
                kind: FailKind::Panicked,
            },
        };
        assert_eq!(Control::decode(&m.encode(), 0).unwrap(), m);
        assert!(Control::decode(&[255, 255], 3)
            .unwrap_err()
            .to_string()
            .contains("from rank 3"));
    }

    #[test]
    fn failures_read_the_same_everywhere() {
        let f = Failure {
            rank: 2,
            node: 7,
            node_name: "x".into(),
            graph: "g".into(),
            message: "bad input".into(),
            kind: FailKind::Failed,
        };
        let e = f.to_error();
        assert_eq!(
            e.to_string(),
            "rank 2: node 'x' (#7) of graph 'g' failed: bad input"
        );
        assert_eq!((e.rank(), e.node()), (Some(2), Some("x")));
    }
}

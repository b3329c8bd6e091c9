//! Sends whose bytes become ready piece by piece: a device buffer copied into page-locked
//! staging memory in chunks on its device, each chunk's copy followed by a write of a mapped
//! host word (`boundpool_gpu::HostSignal`) that this thread reads without a driver call. A
//! message goes out as soon as its bytes are ready, so the device's copy of the next chunk
//! overlaps the transfer of this one. On the wire it is an ordinary value (one message, or the
//! long form's header and chunks), so the receiver needs nothing of its own.

use super::*;

/// A send's bytes that become ready over time.
pub(crate) struct StagedPayload {
    /// The staging memory (kept alive by the run until the send node completes).
    pub(crate) ptr: *const u8,
    /// Its length in bytes.
    pub(crate) len: usize,
    /// The size of the messages it goes as (at most the engine's `max_message`); each goes
    /// once `ready` covers it.
    pub(crate) piece: usize,
    /// How many of its bytes (from the start) are ready to send; read without a driver call.
    pub(crate) ready: Box<dyn Fn() -> usize + Send>,
}

/// A staged send in progress: its messages posted so far.
pub(super) struct StagedSend {
    /// The send's progress entry (`Engine::sends`).
    id: u64,
    to: usize,
    tag: u32,
    payload: StagedPayload,
    /// Bytes per message.
    message: usize,
    /// Messages in all, and posted so far.
    messages: usize,
    posted: usize,
}

/// Messages of `len` bytes in pieces of at most `message` bytes: one for a value that fits,
/// else the long form's chunks (after its header). At least one.
pub(super) fn message_count(len: usize, message: usize) -> usize {
    len.div_ceil(message.max(1)).max(1)
}

impl<T: Transport> Engine<T> {
    /// Starts a staged send: its progress entry now (and the long form's header), its messages
    /// as their bytes become ready (`advance_staged`).
    pub(super) fn post_staged(
        &mut self,
        layout: TagLayout,
        run: Arc<RunState>,
        k: u32,
        payload: StagedPayload,
    ) {
        let spec = &run.graph.sends[k as usize];
        let to = spec.to;
        let message = payload.piece.clamp(1, self.cfg.max_message.max(1));
        let messages = message_count(payload.len, message);
        let long = payload.len > message;
        let tag = layout.tag(run.slot, spec.index, long);
        let id = self.next_send;
        self.next_send += 1;
        let mut progress = SendProgress {
            run: run.clone(),
            k,
            ops_left: messages as u32 + u32::from(long),
            _keep: None,
            _header: None,
        };
        let mut r = Ok(());
        if long {
            let header = Box::new([payload.len as u64, messages as u64]);
            let hptr = header.as_ptr().cast::<u8>();
            progress._header = Some(header);
            r = self.start_send(to, Route::Tag(tag), hptr, 16, OpKind::Send(id));
        }
        self.sends.insert(id, progress);
        self.sending.window.enter();
        self.staged.push(StagedSend {
            id,
            to,
            tag,
            payload,
            message,
            messages,
            posted: 0,
        });
        if let Err(e) = r {
            self.transport_failed(e);
        }
    }

    /// Posts the messages of staged sends whose bytes became ready; returns how many. A send
    /// to a peer that is gone is dropped (its run is failing; its memory stays with the run,
    /// which is never freed under the transport).
    pub(crate) fn advance_staged(&mut self) -> usize {
        if self.staged.is_empty() || self.fatal.is_some() {
            return 0;
        }
        let mut list = std::mem::take(&mut self.staged);
        let mut posted = 0;
        list.retain_mut(|s| {
            if self.fatal.is_some() || self.peers[s.to].state != PeerState::Alive {
                return false;
            }
            let ready = (s.payload.ready)().min(s.payload.len);
            while s.posted < s.messages {
                let start = s.posted * s.message;
                let end = (start + s.message).min(s.payload.len);
                if end > ready {
                    break;
                }
                // SAFETY: `start <= len`: within the staging memory.
                let p = unsafe { s.payload.ptr.add(start) };
                if let Err(e) =
                    self.start_send(s.to, Route::Tag(s.tag), p, end - start, OpKind::Send(s.id))
                {
                    self.transport_failed(e);
                    return false;
                }
                s.posted += 1;
                posted += 1;
            }
            s.posted < s.messages
        });
        self.staged.append(&mut list);
        posted
    }
}

#[cfg(test)]
mod tests {
    use super::message_count;

    #[test]
    fn staged_values_go_in_messages_of_at_most_a_piece() {
        assert_eq!(message_count(0, 4), 1, "an empty value is one message");
        assert_eq!(message_count(3, 4), 1);
        assert_eq!(message_count(4, 4), 1);
        assert_eq!(message_count(5, 4), 2);
        assert_eq!(message_count(64 << 20, 4 << 20), 16);
        assert_eq!(message_count((64 << 20) + 1, 4 << 20), 17);
    }
}

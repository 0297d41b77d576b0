//! The event grammar of Anthropic's Messages streams: every event is named
//! (`event: message_start`, the same name as its data's `type`), there is
//! no `[DONE]`, and the usage is split: `message_start` carries the input
//! tokens (and the cached ones), each `message_delta` the output tokens so
//! far. `message_stop` (or an `error` event) ends the stream. The client
//! always gets the usage: nothing is asked for, nothing is stripped.

use serde_json::Value;

use crate::dialect::answer::Answer;
use crate::dialect::responses::stream::read_named;
use crate::sse::reader::Event;
use crate::sse::{Grammar, Reading, StreamState};

/// What a Messages stream said so far: the usage added up over its events,
/// finished when `message_stop` came after the stop reason, done at
/// `message_stop` or `error`, the text deltas.
#[derive(Debug, Default)]
pub struct Messages {
    state: StreamState,
    /// A `message_delta` gave the stop reason.
    stop_reason: bool,
}

/// The event that carries a piece of the answer's text.
const TEXT_DELTA: &[u8] = b"content_block_delta";

/// The events whose data the grammar reads.
const READ: [&[u8]; 4] = [
    b"message_start",
    b"message_delta",
    b"message_stop",
    b"error",
];

impl Grammar for Messages {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        // A content delta, a ping: nothing for the grammar unless it keeps
        // the text, and no parse when no collector asked for one.
        let text = self.state.transcript.is_some();
        let reads = |n: &[u8]| READ.contains(&n) || (text && n == TEXT_DELTA);
        read_named(event, parse, reads, |_, t| self.note(t))
    }

    fn state(&self) -> &StreamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut StreamState {
        &mut self.state
    }
}

impl Messages {
    fn note(&mut self, data: &Value) {
        let reported = match data.get("type").and_then(Value::as_str) {
            Some("message_start") => data.get("message").and_then(|m| m.get("usage")),
            Some("message_delta") => {
                let stop = data.get("delta").and_then(|d| d.get("stop_reason"));
                self.stop_reason |= stop.is_some_and(|s| !s.is_null());
                if let Some(reason) = stop.and_then(Value::as_str) {
                    self.state.reasons.push(reason);
                }
                data.get("usage")
            }
            Some("message_stop") => {
                self.state.finished = self.stop_reason && !self.state.done;
                self.state.done = true;
                None
            }
            Some("error") => {
                self.state.done = true;
                None
            }
            Some("content_block_delta") => {
                let text = data.get("delta").and_then(|d| d.get("text"));
                if let (Some(t), Some(text)) = (self.state.transcript.as_mut(), text) {
                    // One message: every content block is of choice 0.
                    t.push(0, text.as_str().unwrap_or_default());
                }
                None
            }
            _ => None,
        };
        if let Some(u) = reported.and_then(|u| crate::dialect::messages::Messages.usage(u)) {
            self.state.update_usage(u);
        }
    }
}

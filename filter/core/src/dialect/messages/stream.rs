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
use crate::sse::{FinishReasons, Grammar, Reading, Transcript};
use crate::usage::Usage;

/// What a Messages stream said so far.
#[derive(Debug, Default)]
pub struct Messages {
    /// The usage reported so far, events added up.
    pub usage: Option<Usage>,
    /// A `message_delta` gave the stop reason.
    pub stop_reason: bool,
    /// The stop reasons given, in order.
    pub reasons: FinishReasons,
    /// `message_stop` came after the stop reason: the answer is whole.
    pub finished: bool,
    /// `message_stop` or `error` arrived.
    pub done: bool,
    /// Number of events with data seen.
    pub events: u64,
    /// The text deltas, when kept.
    pub transcript: Option<Transcript>,
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
        self.events += u64::from(event.data.is_some());
        // A content delta, a ping: nothing for the grammar unless it keeps
        // the text, and no parse when no collector asked for one.
        let text = self.transcript.is_some();
        let reads = |n: &[u8]| READ.contains(&n) || (text && n == TEXT_DELTA);
        read_named(event, parse, reads, |_, t| self.note(t))
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn ended(&self) -> bool {
        self.done
    }

    fn finished(&self) -> bool {
        self.finished
    }

    fn finish_reasons(&self) -> &FinishReasons {
        &self.reasons
    }

    fn keep_text(&mut self, limit: usize) {
        self.transcript
            .get_or_insert_with(|| Transcript::new(limit));
    }

    fn transcript(&self) -> Option<&Transcript> {
        self.transcript.as_ref()
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
                    self.reasons.push(reason);
                }
                data.get("usage")
            }
            Some("message_stop") => {
                self.finished = self.stop_reason && !self.done;
                self.done = true;
                None
            }
            Some("error") => {
                self.done = true;
                None
            }
            Some("content_block_delta") => {
                let text = data.get("delta").and_then(|d| d.get("text"));
                if let (Some(t), Some(text)) = (self.transcript.as_mut(), text) {
                    // One message: every content block is of choice 0.
                    t.push(0, text.as_str().unwrap_or_default());
                }
                None
            }
            _ => None,
        };
        if let Some(u) = reported.and_then(|u| crate::dialect::messages::Messages.usage(u)) {
            self.usage = Some(self.usage.map_or(u, |so_far| so_far.updated_by(u)));
        }
    }
}

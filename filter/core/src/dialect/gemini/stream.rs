//! The event grammar of Google's Gemini streams (`alt=sse`): unnamed
//! `data:` events, each a whole `GenerateContentResponse` with the usage so
//! far, and no terminator. What an event says is read by the dialect's
//! [`crate::dialect::gemini`] reading of a response.

use serde_json::Value;

use crate::dialect::gemini::{Head, MAX_CANDIDATES};
use crate::sse::reader::Event;
use crate::sse::{tree_of, Grammar, Parsed, Reading, StreamState};

/// The event grammar of a Gemini stream (`alt=sse`): unnamed `data:`
/// events, each a whole `GenerateContentResponse` with the usage so far;
/// no terminator. The stream ended when every candidate it started gave its
/// `finishReason` (the last event), when the prompt was blocked, or when an
/// error came in place of a response. Finished when a candidate gave its
/// finish reason; the usage is each event's, the call's so far.
#[derive(Debug, Default)]
pub struct Gemini {
    state: StreamState,
    /// Candidates (by index, below [`MAX_CANDIDATES`]) seen, and finished.
    started: u64,
    ended: u64,
}

impl Grammar for Gemini {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        let Some(data) = event.data else {
            return Reading::default();
        };
        // The text is kept from the event's tree: the parse a collector
        // asks for, or one of its own while the text is kept; else only the
        // fields the grammar reads are parsed.
        let tree = tree_of(data, parse || self.state.transcript.is_some());
        match &tree {
            Some(Some(t)) => {
                self.keep(t);
                self.note_tree(t);
            }
            Some(None) => {}
            None => {
                if let Ok(t) = serde_json::from_slice::<Value>(data) {
                    self.note_tree(&t);
                }
            }
        }
        Reading {
            usage_only: false,
            parsed: if parse {
                Parsed::of(tree)
            } else {
                Parsed::Skipped
            },
        }
    }

    fn state(&self) -> &StreamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut StreamState {
        &mut self.state
    }
}

impl Gemini {
    fn note_tree(&mut self, tree: &Value) {
        if let Some(head) = Head::of(tree) {
            self.note(&head);
        }
    }

    /// Takes in what one event says.
    fn note(&mut self, head: &Head<'_>) {
        if head.error() {
            self.state.done = true;
            return;
        }
        if let Some(u) = head.usage() {
            self.state.update_usage(u);
        }
        for reason in head.reasons() {
            self.state.reasons.push(reason);
        }
        for (at, (index, finished)) in head.candidates().enumerate() {
            let index = index.unwrap_or(u64::try_from(at).unwrap_or(u64::MAX));
            self.state.finished |= finished;
            if index >= MAX_CANDIDATES {
                continue;
            }
            let bit = 1u64 << index;
            self.started |= bit;
            if finished {
                self.ended |= bit;
            }
        }
        if head.blocked() || (self.started != 0 && self.started == self.ended) {
            self.state.done = true;
        }
    }

    /// Keeps each candidate's text of an event (its parts' text, thoughts
    /// left out: they are not the answer).
    fn keep(&mut self, tree: &Value) {
        let Some(t) = self.state.transcript.as_mut() else {
            return;
        };
        let candidates = tree.get("candidates").and_then(Value::as_array);
        for (at, c) in candidates.into_iter().flatten().enumerate() {
            let index = c
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(u64::try_from(at).unwrap_or(u64::MAX));
            let parts = c
                .get("content")
                .and_then(|content| content.get("parts"))
                .and_then(Value::as_array);
            for part in parts.into_iter().flatten() {
                if part.get("thought").and_then(Value::as_bool) == Some(true) {
                    continue;
                }
                if let Some(text) = part.get("text").and_then(Value::as_str) {
                    t.push(index, text);
                }
            }
        }
    }
}

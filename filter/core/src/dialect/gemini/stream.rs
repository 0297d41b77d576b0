//! The event grammar of Google's Gemini streams (`alt=sse`): unnamed
//! `data:` events, each a whole `GenerateContentResponse` with the usage so
//! far, and no terminator. What an event says is read by the dialect's
//! [`crate::dialect::gemini`] reading of a response.

use serde_json::Value;

use crate::dialect::gemini::{Head, MAX_CANDIDATES};
use crate::sse::reader::Event;
use crate::sse::{tree_of, FinishReasons, Grammar, Parsed, Reading, Transcript};
use crate::usage::Usage;

/// The event grammar of a Gemini stream (`alt=sse`): unnamed `data:`
/// events, each a whole `GenerateContentResponse` with the usage so far;
/// no terminator. The stream ended when every candidate it started gave its
/// `finishReason` (the last event), when the prompt was blocked, or when an
/// error came in place of a response.
#[derive(Debug, Default)]
pub struct Gemini {
    /// The usage so far (each event reports the whole call's so far).
    pub usage: Option<Usage>,
    /// A candidate gave its finish reason.
    pub finished: bool,
    /// The finish reasons, in the order they came.
    pub reasons: FinishReasons,
    /// The last event passed.
    pub done: bool,
    /// Events with data seen.
    pub events: u64,
    /// Candidates (by index, below [`MAX_CANDIDATES`]) seen, and finished.
    started: u64,
    ended: u64,
    /// The candidates' text, when kept.
    pub transcript: Option<Transcript>,
}

impl Grammar for Gemini {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        let Some(data) = event.data else {
            return Reading::default();
        };
        self.events = self.events.saturating_add(1);
        // The text is kept from the event's tree: the parse a collector
        // asks for, or one of its own while the text is kept; else only the
        // fields the grammar reads are parsed.
        let tree = tree_of(data, parse || self.transcript.is_some());
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

impl Gemini {
    fn note_tree(&mut self, tree: &Value) {
        if let Some(head) = Head::of(tree) {
            self.note(&head);
        }
    }

    /// Takes in what one event says.
    fn note(&mut self, head: &Head<'_>) {
        if head.error() {
            self.done = true;
            return;
        }
        if let Some(u) = head.usage() {
            // Each event reports the call's usage so far: a later count
            // replaces an earlier one, a count it leaves out stays.
            self.usage = Some(self.usage.map_or(u, |so_far| so_far.updated_by(u)));
        }
        for reason in head.reasons() {
            self.reasons.push(reason);
        }
        for (at, (index, finished)) in head.candidates().enumerate() {
            let index = index.unwrap_or(u64::try_from(at).unwrap_or(u64::MAX));
            self.finished |= finished;
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
            self.done = true;
        }
    }

    /// Keeps each candidate's text of an event (its parts' text, thoughts
    /// left out: they are not the answer).
    fn keep(&mut self, tree: &Value) {
        let Some(t) = self.transcript.as_mut() else {
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

//! The event grammar of Anthropic's Messages streams: every event is named
//! (`event: message_start`, the same name as its data's `type`), there is
//! no `[DONE]`, and the usage is split: `message_start` carries the input
//! tokens (and the cached ones), each `message_delta` the output tokens so
//! far. `message_stop` (or an `error` event) ends the stream. The client
//! always gets the usage: nothing is asked for, nothing is stripped.

use serde::Deserialize;

use super::reader::Event;
use super::responses::kind;
use super::{head_of, tree_of, Grammar, Parsed, Reading};
use crate::usage::Usage;

/// What a Messages stream said so far.
#[derive(Debug, Default)]
pub struct Messages {
    /// The usage reported so far, events added up.
    pub usage: Option<Usage>,
    /// A `message_delta` gave the stop reason.
    pub stop_reason: bool,
    /// `message_stop` came after the stop reason: the answer is whole.
    pub finished: bool,
    /// `message_stop` or `error` arrived.
    pub done: bool,
    /// Number of events with data seen.
    pub events: u64,
}

/// What the grammar reads of an event.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    /// `message_start`'s message.
    #[serde(default)]
    message: Option<WithUsage>,
    /// `message_delta`'s usage.
    #[serde(default)]
    usage: Option<Usage>,
    /// `message_delta`'s delta.
    #[serde(default)]
    delta: Option<Delta>,
}

#[derive(Deserialize)]
struct WithUsage {
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// The events whose data the grammar reads.
const READ: [&[u8]; 4] = [
    b"message_start",
    b"message_delta",
    b"message_stop",
    b"error",
];

impl Grammar for Messages {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        let Some(data) = event.data else {
            return Reading::default();
        };
        self.events += 1;
        let tree = tree_of(data, parse);
        let named = kind(event, tree.as_ref().and_then(Option::as_ref));
        // A content delta, a ping: nothing for the grammar, and no parse
        // when no collector asked for one.
        if named.is_none_or(|n| READ.contains(&n)) {
            let head = head_of::<Head>(&tree, data);
            if let Some(h) = head {
                self.note(h);
            }
        }
        Reading {
            usage_only: false,
            parsed: Parsed::of(tree),
        }
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn ended(&self) -> bool {
        self.done
    }
}

impl Messages {
    fn note(&mut self, head: Head) {
        let reported = match head.kind.as_deref() {
            Some("message_start") => head.message.and_then(|m| m.usage),
            Some("message_delta") => {
                self.stop_reason |= head.delta.is_some_and(|d| d.stop_reason.is_some());
                head.usage
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
            _ => None,
        };
        if let Some(u) = reported {
            self.usage = Some(self.usage.map_or(u, |so_far| so_far.updated_by(u)));
        }
    }
}

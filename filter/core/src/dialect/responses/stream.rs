//! The event grammar of OpenAI's Responses streams: every event is named
//! (`event: response.output_text.delta`, the same name as its data's
//! `type`), there is no `[DONE]`, and the usage comes with the final
//! response in `response.completed` (or `response.incomplete`,
//! `response.failed`). The client always gets it: nothing is asked for on
//! its behalf, nothing is stripped.

use serde_json::Value;

use crate::dialect::answer::Answer;
use crate::sse::reader::Event;
use crate::sse::{tree_of, FinishReasons, Grammar, Parsed, Reading, Transcript};
use crate::usage::Usage;

/// The event that opens a Responses stream with the response's id.
const CREATED: &[u8] = b"response.created";

/// The events that end a Responses stream; the first three carry the final
/// response with its usage.
const FINAL: [&[u8]; 4] = [
    b"response.completed",
    b"response.incomplete",
    b"response.failed",
    b"error",
];

/// What a Responses stream said so far.
#[derive(Debug, Default)]
pub struct Responses {
    /// The final response's usage.
    pub usage: Option<Usage>,
    /// The response's id, from `response.created` (or a final event).
    pub response_id: Option<String>,
    /// `response.completed` arrived: the answer is whole.
    pub finished: bool,
    /// A final event arrived.
    pub done: bool,
    /// Why it ended: the final response's incomplete reason, else its
    /// status (`completed`, `incomplete`, `failed`).
    pub reasons: FinishReasons,
    /// Number of events with data seen.
    pub events: u64,
    /// The final response's text, when kept.
    pub transcript: Option<Transcript>,
}

/// The name of an event: its `event:` field, else its data's `type`.
pub(crate) fn kind<'a>(event: &Event<'a>, tree: Option<&'a Value>) -> Option<&'a [u8]> {
    event.kind.or_else(|| {
        tree.and_then(|t| t.get("type"))
            .and_then(Value::as_str)
            .map(str::as_bytes)
    })
}

impl Grammar for Responses {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        self.events += u64::from(event.data.is_some());
        // A delta, an item added: nothing for the grammar, and no parse when
        // no collector asked for one.
        let reads = |n: &[u8]| n == CREATED || FINAL.contains(&n);
        read_named(event, parse, reads, |named, t| self.note(named, t))
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

    fn response_id(&self) -> Option<&str> {
        self.response_id.as_deref()
    }
}

impl Responses {
    fn note(&mut self, named: Option<&[u8]>, data: &Value) {
        let name = named.or_else(|| data.get("type").and_then(Value::as_str).map(str::as_bytes));
        let Some(name) = name.filter(|n| *n == CREATED || FINAL.contains(n)) else {
            return;
        };
        let response = data.get("response");
        if let Some(id) = response.and_then(|r| r.get("id")).and_then(Value::as_str) {
            self.response_id.get_or_insert_with(|| id.to_string());
        }
        if name == CREATED {
            return;
        }
        if !self.done {
            if let Some(reason) = response.and_then(final_reason) {
                self.reasons.push(reason);
            }
            // The final response holds the whole text: read there, not
            // from the deltas.
            if let (Some(t), Some(r)) = (self.transcript.as_mut(), response) {
                keep_output_text(t, r);
            }
        }
        self.done = true;
        self.finished |= name == b"response.completed";
        if let Some(u) = response
            .and_then(|r| r.get("usage"))
            .and_then(|u| crate::dialect::responses::Responses.usage(u))
        {
            self.usage = Some(u);
        }
    }
}

/// The `output_text` parts of a response's message items.
fn keep_output_text(t: &mut Transcript, response: &Value) {
    let items = response.get("output").and_then(Value::as_array);
    for item in items.into_iter().flatten() {
        let parts = item.get("content").and_then(Value::as_array);
        for part in parts.into_iter().flatten() {
            if part.get("type").and_then(Value::as_str) == Some("output_text") {
                t.push(
                    0,
                    part.get("text").and_then(Value::as_str).unwrap_or_default(),
                );
            }
        }
    }
}

/// Why a final response ended: its `incomplete_details.reason`
/// (`max_output_tokens`, `content_filter`), else its `status`.
pub(crate) fn final_reason(response: &Value) -> Option<&str> {
    response
        .get("incomplete_details")
        .and_then(|d| d.get("reason"))
        .and_then(Value::as_str)
        .or_else(|| response.get("status").and_then(Value::as_str))
}

/// The tree of an event a grammar reads: the one parsed for a collector,
/// else its data parsed now; `None` when it is not JSON.
fn read_tree<'a>(
    tree: &'a Option<Option<Value>>,
    data: &[u8],
) -> Option<std::borrow::Cow<'a, Value>> {
    match tree {
        Some(Some(t)) => Some(std::borrow::Cow::Borrowed(t)),
        Some(None) => None,
        None => serde_json::from_slice::<Value>(data)
            .ok()
            .map(std::borrow::Cow::Owned),
    }
}

/// Reads one event of a stream that names its events (Responses,
/// Messages): its data is parsed only when a collector takes it or `reads`
/// says the grammar wants it by its name (`None`: unnamed, read for its
/// `type`), and then handed to `note` with the name.
pub(crate) fn read_named(
    event: &Event<'_>,
    parse: bool,
    reads: impl Fn(&[u8]) -> bool,
    mut note: impl FnMut(Option<&[u8]>, &Value),
) -> Reading {
    let Some(data) = event.data else {
        return Reading::default();
    };
    let tree = tree_of(data, parse);
    let named = kind(event, tree.as_ref().and_then(Option::as_ref));
    if named.is_none_or(&reads) {
        if let Some(t) = read_tree(&tree, data).as_deref() {
            note(named, t);
        }
    }
    Reading {
        usage_only: false,
        parsed: Parsed::of(tree),
    }
}

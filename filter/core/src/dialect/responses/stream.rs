//! The event grammar of OpenAI's Responses streams: every event is named
//! (`event: response.output_text.delta`, the same name as its data's
//! `type`), there is no `[DONE]`, and the usage comes with the final
//! response in `response.completed` (or `response.incomplete`,
//! `response.failed`). The client always gets it: nothing is asked for on
//! its behalf, nothing is stripped.

use serde_json::Value;

use crate::dialect::answer::Answer;
use crate::sse::reader::Event;
use crate::sse::{tree_of, Grammar, Parsed, Reading, StreamState, Transcript};

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

/// What a Responses stream said so far: the final response's usage,
/// finished at `response.completed`, done at any final event, why it ended
/// (the final response's incomplete reason, else its status), its text.
#[derive(Debug, Default)]
pub struct Responses {
    state: StreamState,
    /// The response's id, from `response.created` (or a final event).
    pub response_id: Option<String>,
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
        // A delta, an item added: nothing for the grammar, and no parse when
        // no collector asked for one.
        let reads = |n: &[u8]| n == CREATED || FINAL.contains(&n);
        read_named(event, parse, reads, |named, t| self.note(named, t))
    }

    fn state(&self) -> &StreamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut StreamState {
        &mut self.state
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
        if !self.state.done {
            if let Some(reason) = response.and_then(final_reason) {
                self.state.reasons.push(reason);
            }
            // The final response holds the whole text: read there, not
            // from the deltas.
            if let (Some(t), Some(r)) = (self.state.transcript.as_mut(), response) {
                keep_output_text(t, r);
            }
        }
        self.state.done = true;
        self.state.finished |= name == b"response.completed";
        if let Some(u) = response
            .and_then(|r| r.get("usage"))
            .and_then(|u| crate::dialect::responses::Responses.usage(u))
        {
            self.state.usage = Some(u);
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

//! Rebuilds the complete answer from a streamed one as it passes, so a streamed
//! call fills the cache like a plain one. It takes the chunks the stream's one
//! reading ([`crate::sse`]) parsed; memory is bounded by the entry limit, and
//! only a stream that ended properly (`[DONE]`, every choice finished) counts.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::answer::{Delivery, HEAD_FIELDS, REPLACE_KEYS};
use super::config::Stamp;
use super::entry::{Entry, EntryError};
use crate::dialect::answer::{Choices, Stored};
use crate::dialect::Dialect;
use crate::sse::{Collect, Piece};

/// Rough cost of one choice beyond its content, so many empty choices still
/// count against the limit.
const CHOICE_OVERHEAD: usize = 64;

/// Accumulates an SSE answer chunk by chunk (`chat.completion.chunk` deltas
/// merged per choice: strings concatenated, tool calls merged by index;
/// `text_completion` text concatenated) and yields the equivalent
/// non-streamed answer as an [`Entry`]. Fed as the stream's [`Collect`]or.
#[derive(Debug)]
pub struct StreamAssembler {
    dialect: Dialect,
    shape: Choices,
    limit: usize,
    held: usize,
    failure: Option<EntryError>,
    done: bool,
    head: Map<String, Value>,
    usage: Option<Value>,
    choices: BTreeMap<u64, ChoiceAcc>,
}

#[derive(Debug, Default)]
struct ChoiceAcc {
    delta: Map<String, Value>,
    logprobs: Value,
    finish_reason: Option<Value>,
}

impl StreamAssembler {
    /// An assembler for a streamed answer of a dialect kept in canonical
    /// form from choices (chat, completions), giving up past `limit` bytes
    /// (`cache.max_entry_bytes`); `None` for other dialects (those kept as
    /// sent are not rebuilt).
    pub fn new(dialect: Dialect, limit: u32) -> Option<Self> {
        let Some(Stored::Canonical(Some(shape))) = dialect.answer().stored() else {
            return None;
        };
        Some(Self {
            dialect,
            shape,
            limit: limit as usize,
            held: 0,
            failure: None,
            done: false,
            head: Map::new(),
            usage: None,
            choices: BTreeMap::new(),
        })
    }

    /// True once the stream cannot make an entry (too large, an error event, a
    /// malformed chunk); the glue may then stop feeding it.
    pub fn gave_up(&self) -> bool {
        self.failure.is_some()
    }

    /// The answer as an entry, once the stream has ended.
    pub fn finish(self, stamp: Stamp) -> Result<Entry, EntryError> {
        if let Some(e) = self.failure {
            return Err(e);
        }
        if !self.done
            || self.choices.is_empty()
            || self.choices.values().any(|c| c.finish_reason.is_none())
        {
            return Err(EntryError::Incomplete);
        }
        let dialect = self.dialect;
        let limit = self.limit;
        let model = self
            .head
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let body =
            serde_json::to_string(&self.into_answer()).map_err(|_| EntryError::Incomplete)?;
        if body.len() > limit {
            return Err(EntryError::TooLarge);
        }
        Ok(Entry::new(dialect, Delivery::Json, stamp, model, body))
    }

    fn fail(&mut self, e: EntryError) {
        self.failure = Some(e);
        // Free what was held: nothing of it will be used.
        self.choices.clear();
        self.usage = None;
    }

    fn apply(&mut self, chunk: Value) -> Result<(), EntryError> {
        let Value::Object(mut chunk) = chunk else {
            return Err(EntryError::Incomplete);
        };
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Err(EntryError::Incomplete);
        }
        for field in HEAD_FIELDS {
            if let Some(v) = chunk.remove(field) {
                let held = self.head.get(field).is_some_and(|h| !h.is_null());
                if !held {
                    self.held = self.held.saturating_add(approx_size(&v));
                    self.head.insert(field.to_string(), v);
                }
            }
        }
        if let Some(u) = chunk.remove("usage").filter(|u| !u.is_null()) {
            self.held = self.held.saturating_add(approx_size(&u));
            self.usage = Some(u);
        }
        let choices = match chunk.remove("choices") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(c)) => c,
            Some(_) => return Err(EntryError::Incomplete),
        };
        for choice in choices {
            let Value::Object(mut choice) = choice else {
                return Err(EntryError::Incomplete);
            };
            let index = match choice.get("index") {
                None => 0,
                Some(i) => i.as_u64().ok_or(EntryError::Incomplete)?,
            };
            let delta = if self.shape.message {
                match choice.remove("delta") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(d)) => d,
                    Some(_) => return Err(EntryError::Incomplete),
                }
            } else {
                let mut d = Map::new();
                if let Some(t) = choice.remove("text") {
                    d.insert("text".to_string(), t);
                }
                d
            };
            if !self.choices.contains_key(&index) {
                self.held = self.held.saturating_add(CHOICE_OVERHEAD);
            }
            self.held = self
                .held
                .saturating_add(delta.iter().map(|(k, v)| k.len() + approx_size(v)).sum());
            let acc = self.choices.entry(index).or_default();
            merge_map(&mut acc.delta, delta);
            if let Some(lp) = choice.remove("logprobs") {
                self.held = self.held.saturating_add(approx_size(&lp));
                merge_value(&mut acc.logprobs, lp, "logprobs");
            }
            if let Some(fr) = choice.remove("finish_reason").filter(|f| !f.is_null()) {
                acc.finish_reason = Some(fr);
            }
        }
        if self.held > self.limit {
            return Err(EntryError::TooLarge);
        }
        Ok(())
    }

    fn into_answer(self) -> Value {
        let mut answer = Map::new();
        answer.insert("object".to_string(), Value::from(self.shape.object));
        answer.extend(self.head);
        let choices: Vec<Value> = self
            .choices
            .into_iter()
            .map(|(index, acc)| {
                let mut c = Map::new();
                c.insert("index".to_string(), Value::from(index));
                if self.shape.message {
                    c.insert("message".to_string(), Value::Object(message(acc.delta)));
                } else {
                    let text = acc
                        .delta
                        .get("text")
                        .cloned()
                        .unwrap_or_else(|| Value::from(""));
                    c.insert("text".to_string(), text);
                }
                c.insert("logprobs".to_string(), acc.logprobs);
                c.insert(
                    "finish_reason".to_string(),
                    acc.finish_reason.unwrap_or(Value::Null),
                );
                Value::Object(c)
            })
            .collect();
        answer.insert("choices".to_string(), Value::Array(choices));
        if let Some(u) = self.usage {
            answer.insert("usage".to_string(), u);
        }
        Value::Object(answer)
    }
}

impl Collect for StreamAssembler {
    fn limit(&self) -> usize {
        self.limit
    }

    fn wants(&self) -> bool {
        self.failure.is_none() && !self.done
    }

    fn take(&mut self, piece: Piece) {
        if !self.wants() {
            return;
        }
        let failure = match piece {
            Piece::Chunk(chunk) => self.apply(chunk).err(),
            Piece::NotJson => Some(EntryError::Incomplete),
            Piece::TooLarge => Some(EntryError::TooLarge),
            Piece::End => {
                self.done = true;
                None
            }
        };
        if let Some(e) = failure {
            self.fail(e);
        }
    }
}

/// The message a non-streamed answer would carry for the merged deltas.
fn message(mut delta: Map<String, Value>) -> Map<String, Value> {
    if delta.get("role").is_none_or(Value::is_null) {
        delta.insert("role".to_string(), Value::from("assistant"));
    }
    delta.entry("content").or_insert(Value::Null);
    // `index` only says which call a delta continues; a message has no use for it.
    if let Some(Value::Array(calls)) = delta.get_mut("tool_calls") {
        for call in calls {
            if let Value::Object(c) = call {
                c.remove("index");
            }
        }
    }
    delta
}

fn merge_map(acc: &mut Map<String, Value>, delta: Map<String, Value>) {
    for (k, v) in delta {
        match acc.get_mut(&k) {
            Some(slot) => merge_value(slot, v, &k),
            None => {
                acc.insert(k, v);
            }
        }
    }
}

/// The OpenAI SDKs' delta rules: null never erases, strings concatenate
/// (identifiers are replaced), objects merge, lists of indexed objects merge
/// by `index`, other lists append, anything else is replaced.
fn merge_value(acc: &mut Value, v: Value, key: &str) {
    if v.is_null() {
        return;
    }
    match (acc, v) {
        (Value::String(a), Value::String(b)) if !REPLACE_KEYS.contains(&key) => a.push_str(&b),
        (Value::Object(a), Value::Object(b)) => merge_map(a, b),
        (Value::Array(a), Value::Array(b)) => merge_list(a, b),
        (acc, v) => *acc = v,
    }
}

fn merge_list(acc: &mut Vec<Value>, items: Vec<Value>) {
    let index_of = |v: &Value| v.get("index").and_then(Value::as_u64);
    let indexed = !items.is_empty() && items.iter().all(|i| index_of(i).is_some());
    if !indexed {
        acc.extend(items);
        return;
    }
    for item in items {
        let idx = index_of(&item);
        match acc.iter_mut().find(|a| index_of(a) == idx) {
            Some(a) => merge_value(a, item, ""),
            None => acc.push(item),
        }
    }
}

/// Approximate JSON size of a value, cheap enough to run on every chunk.
fn approx_size(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 8,
        Value::String(s) => s.len().saturating_add(2),
        Value::Array(a) => a.iter().map(approx_size).fold(2, usize::saturating_add),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| k.len().saturating_add(3).saturating_add(approx_size(v)))
            .fold(2, usize::saturating_add),
    }
}

/// The assembler behind a stream's reading, fed as the walk feeds it.
#[cfg(test)]
pub(crate) struct Fed {
    stream: crate::sse::Stream<crate::dialect::chat::stream::Chat>,
    pub(crate) asm: StreamAssembler,
}

#[cfg(test)]
impl Fed {
    pub(crate) fn new(dialect: Dialect, limit: u32) -> Option<Self> {
        Some(Self {
            stream: crate::sse::Stream::new(),
            asm: StreamAssembler::new(dialect, limit)?,
        })
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        self.stream.feed(bytes, false, Some(&mut self.asm));
    }

    pub(crate) fn gave_up(&self) -> bool {
        self.asm.gave_up()
    }

    pub(crate) fn finish(mut self, stamp: Stamp) -> Result<Entry, EntryError> {
        self.stream.feed(&[], true, Some(&mut self.asm));
        self.asm.finish(stamp)
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::dialect::chat::stream::Chat;
    use crate::fuzz;
    use crate::sse::{Stream, MAX_EVENT};

    const STAMP: Stamp = Stamp {
        stored_at_ms: 1,
        expires_at_ms: 2,
    };

    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            fuzz::text().prop_map(|t| format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}}}}]}}\n\n", serde_json::to_string(&t).unwrap()).into_bytes()),
            fuzz::text().prop_map(|t| format!("data: {}\n", t).into_bytes()),
            (1usize..5_000).prop_map(|n| vec![b'x'; n]),
            Just(b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_vec()),
        ]
    }

    proptest! {
        #![proptest_config(fuzz::config(128))]

        /// Whatever arrives, what the assembler holds stays within its limit
        /// (and the stream's reader within one event), and an entry it gives
        /// is within the limit too.
        #[test]
        fn memory_stays_within_the_limit(pieces in prop::collection::vec(piece(), 0..40), limit in 64u32..8_192) {
            let mut stream: Stream<Chat> = Stream::new();
            let mut asm = StreamAssembler::new(Dialect::Chat, limit).unwrap();
            let bound = limit as usize;
            for p in &pieces {
                stream.feed(p, false, Some(&mut asm));
                prop_assert!(stream.pending() <= MAX_EVENT);
                prop_assert!(stream.pending() <= bound || asm.gave_up() || asm.done);
                prop_assert!(asm.held <= bound || asm.gave_up());
            }
            stream.feed(&[], true, Some(&mut asm));
            if let Ok(entry) = asm.finish(STAMP) {
                prop_assert!(entry.body().len() <= bound);
            }
        }
    }
}

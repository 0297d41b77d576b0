//! The event grammar of OpenAI's chat and text completions streams: every
//! event is one `data:` JSON chunk, `data: [DONE]` ends the stream, and the
//! chunk with `"choices":[]` and a `usage` object is the one
//! `stream_options.include_usage` asks for. Also writes that grammar, for
//! the cache's replay.

use serde::Deserialize;
use serde_json::Value;

use crate::dialect::Dialect;
use crate::sse::reader::{Event, DATA_FIELD, EVENT_END};
use crate::sse::{Grammar, Parsed, Reading, StreamState};

/// The data of the event that ends a stream.
pub(crate) const DONE: &[u8] = b"[DONE]";

/// What a chat stream said so far: the usage of the last chunk that
/// carried one, finished when a choice's `finish_reason` is not null,
/// done at `data: [DONE]`, the choices' text.
#[derive(Debug)]
pub struct Chat {
    /// The dialect whose names the usage is read by.
    dialect: Dialect,
    state: StreamState,
}

impl Default for Chat {
    fn default() -> Self {
        Self::of(Dialect::Chat)
    }
}

impl Chat {
    /// The grammar of `dialect`'s streams, its usage read by its names.
    pub fn of(dialect: Dialect) -> Self {
        Self {
            dialect,
            state: StreamState::default(),
        }
    }
}

/// What the grammar reads of a chunk; the rest is skipped unparsed unless a
/// collector asked for the whole tree.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    choices: Option<Vec<ChoiceHead>>,
}

#[derive(Deserialize)]
struct ChoiceHead {
    /// Any value but null finishes the choice; a string says why.
    #[serde(default)]
    finish_reason: Option<Value>,
}

impl Grammar for Chat {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        let Some(data) = event.data else {
            return Reading::default();
        };
        if data == DONE {
            self.state.done = true;
            return Reading::default();
        }
        #[cfg(test)]
        tests::count_parse();
        // Text is kept from the chunk's tree: the parse a collector asks
        // for, so keeping it costs the module no parser of its own.
        let (head, parsed) = if parse || self.state.transcript.is_some() {
            match serde_json::from_slice::<Value>(data) {
                Ok(tree) => {
                    self.keep(&tree);
                    let head = Head::deserialize(&tree).ok();
                    (
                        head,
                        if parse {
                            Parsed::Tree(tree)
                        } else {
                            Parsed::Skipped
                        },
                    )
                }
                Err(_) => (
                    None,
                    if parse {
                        Parsed::NotJson
                    } else {
                        Parsed::Skipped
                    },
                ),
            }
        } else {
            (serde_json::from_slice::<Head>(data).ok(), Parsed::Skipped)
        };
        Reading {
            usage_only: head.is_some_and(|h| self.note(h)),
            parsed,
        }
    }

    fn state(&self) -> &StreamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut StreamState {
        &mut self.state
    }
}

impl Chat {
    /// Keeps each choice's text of a chunk: a chat `delta.content`, a
    /// completion's `text`.
    fn keep(&mut self, tree: &Value) {
        let Some(t) = self.state.transcript.as_mut() else {
            return;
        };
        let choices = tree.get("choices").and_then(Value::as_array);
        for c in choices.into_iter().flatten() {
            let text = c
                .get("delta")
                .and_then(|d| d.get("content"))
                .or_else(|| c.get("text"))
                .and_then(Value::as_str);
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            t.push(index, text.unwrap_or_default());
        }
    }

    /// Takes in what a chunk says; true when it is a usage-only chunk.
    fn note(&mut self, head: Head) -> bool {
        let usage = head
            .usage
            .as_ref()
            .and_then(|u| self.dialect.answer().usage(u));
        if usage.is_some() {
            self.state.usage = usage;
        }
        for reason in head
            .choices
            .iter()
            .flatten()
            .filter_map(|c| c.finish_reason.as_ref())
        {
            self.state.finished = true;
            self.state.reasons.push(reason.as_str().unwrap_or_default());
        }
        head.usage.is_some() && head.choices.is_some_and(|c| c.is_empty())
    }
}

/// Writes one chunk as an event.
pub(crate) fn write_chunk(out: &mut Vec<u8>, chunk: &Value) {
    out.extend_from_slice(DATA_FIELD);
    out.extend_from_slice(b": ");
    // Writing a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, chunk);
    out.extend_from_slice(EVENT_END);
}

/// Writes the event that ends a stream.
pub(crate) fn write_done(out: &mut Vec<u8>) {
    out.extend_from_slice(DATA_FIELD);
    out.extend_from_slice(b": ");
    out.extend_from_slice(DONE);
    out.extend_from_slice(EVENT_END);
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use serde_json::json;

    use super::*;
    use crate::sse::Stream;
    use crate::usage::Usage;

    thread_local! {
        static PARSES: Cell<u64> = const { Cell::new(0) };
    }

    pub(crate) fn count_parse() {
        PARSES.with(|p| p.set(p.get() + 1));
    }

    /// JSON parses of event data on this thread so far.
    pub(crate) fn parses() -> u64 {
        PARSES.with(Cell::get)
    }

    #[test]
    fn written_events_read_back() {
        let chunk = json!({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}});
        let mut out = Vec::new();
        write_chunk(&mut out, &chunk);
        write_done(&mut out);
        assert_eq!(
            out,
            b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":3,\"prompt_tokens\":2}}\n\ndata: [DONE]\n\n"
        );
        let mut s = Stream::<Chat>::new();
        s.feed(&out, false, None);
        let g = s.grammar();
        assert_eq!(
            g.usage(),
            Some(Usage {
                prompt_tokens: 2,
                completion_tokens: 3,
                cached_tokens: 0,
                ..Usage::default()
            })
        );
        assert!(g.ended() && !g.finished());
        assert_eq!(s.events(), 2);
    }

    #[test]
    fn reads_what_a_chunk_says() {
        for (data, usage, finished, usage_only) in [
            (
                r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
                Some(1),
                false,
                true,
            ),
            (r#"{"choices":[],"usage":{}}"#, Some(0), false, true),
            // A usage this filter cannot read is still the chunk it asked for.
            (
                r#"{"choices":[],"usage":{"prompt_tokens":"1"}}"#,
                None,
                false,
                true,
            ),
            (r#"{"choices":[],"usage":null}"#, None, false, false),
            (r#"{"usage":{"prompt_tokens":1}}"#, Some(1), false, false),
            (
                r#"{"choices":[{"finish_reason":"stop"}],"usage":{"prompt_tokens":4}}"#,
                Some(4),
                true,
                false,
            ),
            (
                r#"{"choices":[{"finish_reason":null}]}"#,
                None,
                false,
                false,
            ),
            (r#"{"choices":[1]}"#, None, false, false),
            (r#"{"choices":"x"}"#, None, false, false),
            ("[DONE", None, false, false),
        ] {
            for parse in [false, true] {
                let mut chat = Chat::default();
                let event = Event {
                    kind: None,
                    data: Some(data.as_bytes()),
                    oversize: false,
                    end: None,
                };
                let r = chat.read(&event, parse);
                assert_eq!(chat.usage().map(|u| u.prompt_tokens), usage, "{data}");
                assert_eq!(chat.finished(), finished, "{data}");
                assert_eq!(r.usage_only, usage_only, "{data}");
                let tree = serde_json::from_str::<Value>(data).ok();
                match (parse, r.parsed) {
                    (false, Parsed::Skipped) => {}
                    (true, Parsed::Tree(t)) => assert_eq!(Some(t), tree),
                    (true, Parsed::NotJson) => assert_eq!(tree, None),
                    (_, other) => panic!("{data}: {other:?}"),
                }
            }
        }
    }
}

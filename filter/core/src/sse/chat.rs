//! The event grammar of OpenAI's chat and text completions streams: every
//! event is one `data:` JSON chunk, `data: [DONE]` ends the stream, and the
//! chunk with `"choices":[]` and a `usage` object is the one
//! `stream_options.include_usage` asks for. Also writes that grammar, for
//! the cache's replay.

use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::reader::{Event, DATA_FIELD, EVENT_END};
use super::{FinishReasons, Grammar, Parsed, Reading, Transcript};
use crate::usage::Usage;

/// The data of the event that ends a stream.
pub(crate) const DONE: &[u8] = b"[DONE]";

/// What a chat stream said so far: its usage, whether a choice finished,
/// whether it ended.
#[derive(Debug, Default)]
pub struct Chat {
    /// Usage of the last chunk that carried one.
    pub usage: Option<Usage>,
    /// A choice finished (`finish_reason` not null).
    pub finished: bool,
    /// The choices' finish reasons, in the order they came.
    pub reasons: FinishReasons,
    /// The `data: [DONE]` terminator arrived.
    pub done: bool,
    /// Number of events with data seen.
    pub events: u64,
    /// The choices' text, when kept.
    pub transcript: Option<Transcript>,
}

/// What the grammar reads of a chunk; the rest is skipped unparsed unless a
/// collector asked for the whole tree. `T` is what it reads of a choice's
/// text: nothing ([`IgnoredAny`]) unless the text is kept ([`Said`]), so a
/// stream whose text nobody keeps pays nothing for it.
#[derive(Deserialize)]
#[serde(bound = "T: Deserialize<'de> + Default")]
struct Head<T> {
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    choices: Option<Vec<ChoiceHead<T>>>,
}

#[derive(Deserialize)]
#[serde(bound = "T: Deserialize<'de> + Default")]
struct ChoiceHead<T> {
    /// Any value but null finishes the choice; a string says why.
    #[serde(default)]
    finish_reason: Option<Value>,
    /// Any JSON: a chunk whose index is odd still says its usage.
    #[serde(default)]
    index: Option<Value>,
    /// A chat chunk's `delta`.
    #[serde(default)]
    delta: T,
    /// A text completion chunk's `text`.
    #[serde(default)]
    text: T,
}

/// The text of a choice's chunk: a completion's `text` string, or a chat
/// `delta`'s `content`.
#[derive(Default)]
struct Said(Option<String>);

impl<'de> Deserialize<'de> for Said {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Said;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a text or a delta")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Said, E> {
                Ok(Said(Some(s.to_string())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Said, E> {
                Ok(Said(None))
            }
            // Anything else says no text, and spoils nothing else of the chunk.
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Said, E> {
                Ok(Said(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Said, E> {
                Ok(Said(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Said, E> {
                Ok(Said(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Said, E> {
                Ok(Said(None))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Said, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Said(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Said, A::Error> {
                let mut text = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "content" {
                        text = match map.next_value::<Value>()? {
                            Value::String(s) => Some(s),
                            _ => None,
                        };
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Said(text))
            }
        }
        d.deserialize_any(V)
    }
}

/// What a choice's chunk said of its text.
trait Text {
    fn text(&self) -> Option<&str>;
}

impl Text for IgnoredAny {
    fn text(&self) -> Option<&str> {
        None
    }
}

impl Text for Said {
    fn text(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl Grammar for Chat {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        let Some(data) = event.data else {
            return Reading::default();
        };
        self.events += 1;
        if data == DONE {
            self.done = true;
            return Reading::default();
        }
        #[cfg(test)]
        tests::count_parse();
        if self.transcript.is_some() {
            self.read_chunk::<Said>(data, parse)
        } else {
            self.read_chunk::<IgnoredAny>(data, parse)
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

impl Chat {
    /// Parses one chunk's data, reading its text as `T`.
    fn read_chunk<T>(&mut self, data: &[u8], parse: bool) -> Reading
    where
        T: for<'de> Deserialize<'de> + Default + Text,
    {
        let (head, parsed) = if parse {
            match serde_json::from_slice::<Value>(data) {
                Ok(tree) => (Head::<T>::deserialize(&tree).ok(), Parsed::Tree(tree)),
                Err(_) => (None, Parsed::NotJson),
            }
        } else {
            (
                serde_json::from_slice::<Head<T>>(data).ok(),
                Parsed::Skipped,
            )
        };
        Reading {
            usage_only: head.is_some_and(|h| self.note(h)),
            parsed,
        }
    }

    /// Takes in what a chunk says; true when it is a usage-only chunk.
    fn note<T: Text>(&mut self, head: Head<T>) -> bool {
        let usage = head.usage.as_ref().and_then(|u| Usage::deserialize(u).ok());
        if usage.is_some() {
            self.usage = usage;
        }
        for choice in head.choices.iter().flatten() {
            if let Some(t) = self.transcript.as_mut() {
                let text = choice.delta.text().or_else(|| choice.text.text());
                let index = choice.index.as_ref().and_then(Value::as_u64).unwrap_or(0);
                t.push(index, text.unwrap_or_default());
            }
            if let Some(reason) = &choice.finish_reason {
                self.finished = true;
                self.reasons.push(reason.as_str().unwrap_or_default());
            }
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

    thread_local! {
        static PARSES: Cell<u64> = const { Cell::new(0) };
    }

    pub(in crate::sse) fn count_parse() {
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
            g.usage,
            Some(Usage {
                prompt_tokens: 2,
                completion_tokens: 3,
                cached_tokens: 0
            })
        );
        assert!(g.done && !g.finished);
        assert_eq!(g.events, 2);
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
                assert_eq!(chat.usage.map(|u| u.prompt_tokens), usage, "{data}");
                assert_eq!(chat.finished, finished, "{data}");
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

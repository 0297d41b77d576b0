//! A cached answer. The dialect says how its answers are kept
//! ([`Stored`]): chat, completions and embeddings answers in one canonical
//! form, the provider's non-streamed JSON, so an entry filled by a plain call
//! can answer a streamed one and the other way round; Responses and Messages
//! answers as the upstream sent them, the JSON or every byte of the stream,
//! answering only calls asking for that delivery. Only complete, successful
//! answers become entries.

use bincode::Options;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{Stamp, MAX_ENTRY_BYTES};
use super::replay;
use crate::dialect::answer::Stored;
use crate::dialect::Dialect;
use crate::host::codec;

pub use super::answer::Delivery;

/// Content type of a JSON reply.
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// Content type of an SSE reply.
pub const SSE_CONTENT_TYPE: &str = "text/event-stream";

/// Version of the encoding; a mismatch reads as corrupt, so entries written by
/// another version of the filter are misses, never misread. 2: the dialect
/// by its name and the delivery, in place of one kind for both.
const FORMAT: u32 = 2;

/// Why an answer was not made into an entry, or an entry cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryError {
    /// The upstream status was not 200: errors are never cached.
    Status(u16),
    /// The body is not a complete answer (not JSON, an `error`, no choices, a
    /// choice without `finish_reason`, a stream without `[DONE]`, a response
    /// not `completed`, a message without its `stop_reason`, a stream that did
    /// not finish).
    Incomplete,
    /// The answer came in another delivery than the call asked for (a stream
    /// to a JSON call): kept as sent, it could not answer the key's calls.
    Delivery,
    /// Larger than `cache.max_entry_bytes`.
    TooLarge,
    /// Bytes that do not decode as an entry of this version: treat as a miss.
    Corrupt,
    /// The dialect's answers are never cached.
    Dialect,
}

impl EntryError {
    /// A short name for logs and the `result` label of store metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Status(_) => "status",
            Self::Incomplete => "incomplete",
            Self::TooLarge => "too_large",
            Self::Corrupt => "corrupt",
            Self::Dialect => "endpoint",
            Self::Delivery => "delivery",
        }
    }
}

/// A cached answer with its metadata. Field order matters: the store decodes
/// the leading times alone to choose a slot to replace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    stored_at_ms: u64,
    expires_at_ms: u64,
    status: u16,
    #[serde(with = "dialect_name")]
    dialect: Dialect,
    delivery: Delivery,
    model: String,
    body: String,
}

/// A reply ready to send: the content type and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// `application/json` or `text/event-stream`.
    pub content_type: &'static str,
    /// The complete body.
    pub body: Vec<u8>,
}

impl Entry {
    /// An entry from a non-streamed answer. `limit` is `cache.max_entry_bytes`.
    pub fn from_json(
        dialect: Dialect,
        status: u16,
        body: &[u8],
        stamp: Stamp,
        limit: u32,
    ) -> Result<Self, EntryError> {
        let answer = serde_json::from_slice::<Value>(body).ok();
        Self::from_answer(dialect, status, body, answer.as_ref(), stamp, limit)
    }

    /// [`Entry::from_json`] for an answer already parsed (`answer`: `None`
    /// when `body` is not JSON), so a body read for other reasons is parsed once.
    pub fn from_answer(
        dialect: Dialect,
        status: u16,
        body: &[u8],
        answer: Option<&Value>,
        stamp: Stamp,
        limit: u32,
    ) -> Result<Self, EntryError> {
        let stored = dialect.answer().stored().ok_or(EntryError::Dialect)?;
        if status != 200 {
            return Err(EntryError::Status(status));
        }
        if body.len() > limit as usize {
            return Err(EntryError::TooLarge);
        }
        let answer = answer.ok_or(EntryError::Incomplete)?;
        if !is_complete(dialect, answer) {
            return Err(EntryError::Incomplete);
        }
        // The canonical form is the answer without the space around it; an
        // answer kept as sent keeps every byte.
        let body = match stored {
            Stored::Canonical(_) => body.trim_ascii(),
            Stored::AsSent => body,
        };
        let body = String::from_utf8(body.to_vec()).map_err(|_| EntryError::Incomplete)?;
        Ok(Self::new(
            dialect,
            Delivery::Json,
            stamp,
            model_of(answer),
            body,
        ))
    }

    /// An entry from a streamed answer of a dialect kept as the upstream sent
    /// it: `body` is every byte of the stream (`None`: it outgrew its copy),
    /// `finished` that its grammar saw the answer complete. Its status was 200.
    pub fn from_stream(
        dialect: Dialect,
        body: Option<&[u8]>,
        finished: bool,
        stamp: Stamp,
        limit: u32,
    ) -> Result<Self, EntryError> {
        if dialect.answer().stored() != Some(Stored::AsSent) {
            return Err(EntryError::Dialect);
        }
        let body = body
            .filter(|b| b.len() <= limit as usize)
            .ok_or(EntryError::TooLarge)?;
        if !finished {
            return Err(EntryError::Incomplete);
        }
        // SSE is UTF-8 by its definition.
        let body = String::from_utf8(body.to_vec()).map_err(|_| EntryError::Incomplete)?;
        Ok(Self::new(
            dialect,
            Delivery::Stream,
            stamp,
            String::new(),
            body,
        ))
    }

    /// An entry from an answer of `dialect` already in its stored form and
    /// checked, as it was delivered (`Json` for a canonical form).
    pub(crate) fn new(
        dialect: Dialect,
        delivery: Delivery,
        stamp: Stamp,
        model: String,
        body: String,
    ) -> Self {
        Self {
            stored_at_ms: stamp.stored_at_ms,
            expires_at_ms: stamp.expires_at_ms.max(stamp.stored_at_ms),
            status: 200,
            dialect,
            delivery,
            model,
            body,
        }
    }

    /// When it was stored, ms since the epoch.
    pub fn stored_at_ms(&self) -> u64 {
        self.stored_at_ms
    }

    /// When it stops being fresh, ms since the epoch.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// The upstream status it was stored from (always 200).
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The dialect of the answer.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// How the answer was delivered (`Json` for a canonical form).
    pub fn delivery(&self) -> Delivery {
        self.delivery
    }

    /// The model that answered, as the answer names it (may be empty).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The answer: canonical, non-streamed JSON, or as the upstream sent it.
    pub fn body(&self) -> &[u8] {
        self.body.as_bytes()
    }

    /// Whole seconds since it was stored, for the `age` header.
    pub fn age_s(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.stored_at_ms) / 1000
    }

    /// The reply for a request: the JSON answer, or for a streamed chat or
    /// completions request an SSE stream replaying it, with the usage chunk
    /// only when the request asked for it. Embeddings are always JSON. An
    /// answer kept as sent is replayed byte for byte, and only to a request
    /// of its delivery.
    pub fn reply(&self, stream: bool, include_usage: bool) -> Result<Reply, EntryError> {
        let as_is = |content_type| Reply {
            content_type,
            body: self.body.as_bytes().to_vec(),
        };
        match self.dialect.answer().stored() {
            Some(Stored::AsSent) => {
                if self.delivery != Delivery::of(stream) {
                    return Err(EntryError::Delivery);
                }
                Ok(as_is(match self.delivery {
                    Delivery::Json => JSON_CONTENT_TYPE,
                    Delivery::Stream => SSE_CONTENT_TYPE,
                }))
            }
            Some(Stored::Canonical(Some(choices))) if stream => Ok(Reply {
                content_type: SSE_CONTENT_TYPE,
                body: replay::sse(choices, &self.body, include_usage).ok_or(EntryError::Corrupt)?,
            }),
            Some(Stored::Canonical(_)) => Ok(as_is(JSON_CONTENT_TYPE)),
            // A dialect whose answers are never kept: not an entry of ours.
            None => Err(EntryError::Corrupt),
        }
    }

    /// The bincode encoding.
    pub fn encode(&self) -> Result<Vec<u8>, EntryError> {
        let mut out = Vec::new();
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Appends the bincode encoding to `out`.
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), EntryError> {
        options()
            .serialize_into(out, &(FORMAT, self))
            .map_err(|_| EntryError::TooLarge)
    }

    /// Decodes [`Entry::encode`]'s output; anything else (truncated, another
    /// version, trailing bytes) is [`EntryError::Corrupt`], never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, EntryError> {
        let (format, entry): (u32, Entry) = options()
            .reject_trailing_bytes()
            .deserialize(bytes)
            .map_err(|_| EntryError::Corrupt)?;
        if format != FORMAT || entry.status != 200 || entry.expires_at_ms < entry.stored_at_ms {
            return Err(EntryError::Corrupt);
        }
        Ok(entry)
    }
}

/// The times at the head of an encoded entry, read without decoding the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) struct EntryHead {
    format: u32,
    /// Store time.
    pub stored_at_ms: u64,
    /// Expiry time.
    pub expires_at_ms: u64,
}

impl EntryHead {
    /// Reads the head; `None` when the bytes are not an entry of this version.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let head: Self = options().allow_trailing_bytes().deserialize(bytes).ok()?;
        (head.format == FORMAT).then_some(head)
    }
}

/// Fixed-width integers keep the head at a known offset; the limit bounds what
/// a corrupt length prefix can make the decoder allocate.
pub(crate) fn options() -> impl Options + Copy {
    codec::options(u64::from(MAX_ENTRY_BYTES).saturating_mul(2))
}

fn model_of(answer: &Value) -> String {
    answer
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The dialect kept by its name, which stays when dialects are added.
mod dialect_name {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    use crate::dialect::Dialect;

    pub(super) fn serialize<S: Serializer>(d: &Dialect, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.api())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Dialect, D::Error> {
        let name = String::deserialize(d)?;
        Dialect::named(&name).ok_or_else(|| D::Error::custom("no such dialect"))
    }
}

/// True when a JSON answer is a complete success worth keeping: an object,
/// no `error` in it, and complete as its dialect says.
fn is_complete(dialect: Dialect, answer: &Value) -> bool {
    let Some(obj) = answer.as_object() else {
        return false;
    };
    if obj.get("error").is_some_and(|e| !e.is_null()) {
        return false;
    }
    dialect.answer().complete(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const STAMP: Stamp = Stamp {
        stored_at_ms: 1_000,
        expires_at_ms: 61_000,
    };

    const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11},"system_fingerprint":"fp_1"}"#;

    #[test]
    fn keeps_complete_answers_only() {
        let e = Entry::from_json(Dialect::Chat, 200, ANSWER.as_bytes(), STAMP, 4096).unwrap();
        assert_eq!(e.model(), "gpt-4o-2024-08-06");
        assert_eq!((e.dialect(), e.delivery()), (Dialect::Chat, Delivery::Json));
        assert_eq!(
            (e.stored_at_ms(), e.expires_at_ms(), e.status()),
            (1_000, 61_000, 200)
        );
        assert_eq!(e.body(), ANSWER.as_bytes());
        assert_eq!(e.age_s(4_999), 3);
        assert_eq!(e.age_s(0), 0);
        for (status, body, err) in [
            (500, ANSWER, EntryError::Status(500)),
            (200, "{", EntryError::Incomplete),
            (200, "[]", EntryError::Incomplete),
            (200, r#"{"error":{"message":"x"}}"#, EntryError::Incomplete),
            (200, r#"{"choices":[]}"#, EntryError::Incomplete),
            (
                200,
                r#"{"choices":[{"message":{},"finish_reason":null}]}"#,
                EntryError::Incomplete,
            ),
        ] {
            assert_eq!(
                Entry::from_json(Dialect::Chat, status, body.as_bytes(), STAMP, 4096),
                Err(err),
                "{body}"
            );
        }
        assert_eq!(
            Entry::from_json(Dialect::Chat, 200, ANSWER.as_bytes(), STAMP, 100),
            Err(EntryError::TooLarge)
        );
        assert_eq!(
            Entry::from_json(Dialect::Other, 200, ANSWER.as_bytes(), STAMP, 4096),
            Err(EntryError::Dialect)
        );
        let emb = r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"e"}"#;
        let e = Entry::from_json(Dialect::Embeddings, 200, emb.as_bytes(), STAMP, 4096).unwrap();
        let r = e.reply(true, true).unwrap();
        assert_eq!(r.content_type, JSON_CONTENT_TYPE);
        assert_eq!(r.body, emb.as_bytes());
    }

    const MESSAGE: &str = "{\"id\":\"msg_1\",\"type\":\"message\",\"model\":\"claude\",\"content\":[],\"stop_reason\":\"end_turn\"}\n";
    const STREAM: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    #[test]
    fn responses_and_messages_are_kept_as_sent() {
        let json =
            |dialect, body: &str| Entry::from_json(dialect, 200, body.as_bytes(), STAMP, 4096);
        let e = json(Dialect::Messages, MESSAGE).unwrap();
        assert_eq!(
            (e.dialect(), e.delivery()),
            (Dialect::Messages, Delivery::Json)
        );
        assert_eq!((e.body(), e.model()), (MESSAGE.as_bytes(), "claude"));
        let r = e.reply(false, true).unwrap();
        assert_eq!(
            (r.content_type, r.body.as_slice()),
            (JSON_CONTENT_TYPE, MESSAGE.as_bytes())
        );
        assert_eq!(e.reply(true, false), Err(EntryError::Delivery));
        let done =
            r#"{"id":"resp_1","object":"response","status":"completed","output":[],"error":null}"#;
        let e = json(Dialect::Responses, done).unwrap();
        assert_eq!(
            (e.dialect(), e.delivery()),
            (Dialect::Responses, Delivery::Json)
        );
        for (dialect, body) in [
            (Dialect::Responses, done.replace("completed", "incomplete")),
            (Dialect::Responses, done.replace("null", r#"{"code":"x"}"#)),
            (Dialect::Messages, MESSAGE.replace("\"end_turn\"", "null")),
            (
                Dialect::Messages,
                MESSAGE.replace("\"message\"", "\"error\""),
            ),
        ] {
            assert_eq!(json(dialect, &body), Err(EntryError::Incomplete), "{body}");
        }

        let stream = |dialect, body: Option<&[u8]>, finished, limit| {
            Entry::from_stream(dialect, body, finished, STAMP, limit)
        };
        let e = stream(Dialect::Messages, Some(STREAM.as_bytes()), true, 4096).unwrap();
        assert_eq!(
            (e.dialect(), e.delivery()),
            (Dialect::Messages, Delivery::Stream)
        );
        let r = e.reply(true, false).unwrap();
        assert_eq!(
            (r.content_type, r.body.as_slice()),
            (SSE_CONTENT_TYPE, STREAM.as_bytes())
        );
        assert_eq!(e.reply(false, false), Err(EntryError::Delivery));
        assert_eq!(Entry::decode(&e.encode().unwrap()), Ok(e));
        let s = Some(STREAM.as_bytes());
        for (got, want) in [
            (
                stream(Dialect::Responses, s, false, 4096),
                EntryError::Incomplete,
            ),
            (
                stream(Dialect::Messages, None, true, 4096),
                EntryError::TooLarge,
            ),
            (stream(Dialect::Messages, s, true, 10), EntryError::TooLarge),
            (
                stream(Dialect::Messages, Some(b"data: \xff\n\n"), true, 4096),
                EntryError::Incomplete,
            ),
            (stream(Dialect::Chat, s, true, 4096), EntryError::Dialect),
        ] {
            assert_eq!(got, Err(want));
        }
    }

    #[test]
    fn encodes_and_refuses_corrupt_bytes() {
        let e = Entry::from_json(Dialect::Chat, 200, ANSWER.as_bytes(), STAMP, 4096).unwrap();
        let bytes = e.encode().unwrap();
        assert_eq!(Entry::decode(&bytes), Ok(e.clone()));
        let head = EntryHead::decode(&bytes).unwrap();
        assert_eq!((head.stored_at_ms, head.expires_at_ms), (1_000, 61_000));
        for cut in 0..bytes.len() {
            assert_eq!(
                Entry::decode(&bytes[..cut]),
                Err(EntryError::Corrupt),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Entry::decode(&longer), Err(EntryError::Corrupt));
        let mut other_version = bytes.clone();
        other_version[0] = 9;
        assert_eq!(Entry::decode(&other_version), Err(EntryError::Corrupt));
        assert!(EntryHead::decode(&other_version).is_none());
        // A length prefix claiming gigabytes must fail, not allocate.
        let mut huge = bytes.clone();
        let model_len_at = 4 + 8 + 8 + 2 + 4;
        huge[model_len_at..model_len_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(Entry::decode(&huge), Err(EntryError::Corrupt));
        // Every single-byte flip decodes to an error or to some entry, never a panic.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xa5;
            let _ = Entry::decode(&b);
        }
    }
}

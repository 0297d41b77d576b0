//! Token usage as the provider reports it, from a JSON answer or from the SSE
//! stream of a streamed answer (the final chunk carries `usage` when the client
//! asked with `stream_options.include_usage`), read without holding the stream.

use serde::Deserialize;

use crate::json::{Document, Json};

/// Tokens of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// Input tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Output tokens (absent for embeddings).
    #[serde(default)]
    pub completion_tokens: u64,
}

#[derive(Deserialize)]
struct WithUsage {
    usage: Option<Usage>,
}

/// The `usage` of a JSON answer body.
pub fn from_json(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<WithUsage>(body).ok()?.usage
}

/// The `usage` of a JSON answer already parsed.
pub fn from_value(answer: &serde_json::Value) -> Option<Usage> {
    WithUsage::deserialize(answer).ok()?.usage
}

/// Longest SSE line kept while scanning; longer lines are skipped.
const MAX_LINE: usize = 256 * 1024;

/// Reads an SSE stream chunk by chunk as it passes, remembering the usage,
/// whether a `finish_reason` was seen and whether the stream ended with
/// `[DONE]`. Memory is bounded by one line.
#[derive(Debug, Default)]
pub struct SseScanner {
    line: Vec<u8>,
    skipping: bool,
    /// Usage of the last chunk that carried one.
    pub usage: Option<Usage>,
    /// A choice finished (`finish_reason` not null).
    pub finished: bool,
    /// The `data: [DONE]` terminator arrived.
    pub done: bool,
    /// Number of `data:` events seen.
    pub events: u64,
}

#[derive(Deserialize)]
struct Chunk {
    usage: Option<Usage>,
    #[serde(default)]
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    finish_reason: Option<String>,
}

impl SseScanner {
    /// A scanner at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next piece of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        for part in bytes.split_inclusive(|b| *b == b'\n') {
            let complete = part.last() == Some(&b'\n');
            if !self.skipping {
                if self.line.len().saturating_add(part.len()) > MAX_LINE {
                    self.skipping = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(part);
                }
            }
            if complete {
                if !self.skipping {
                    let line = std::mem::take(&mut self.line);
                    self.line_done(&line);
                    self.line = line;
                    self.line.clear();
                }
                self.skipping = false;
            }
        }
    }

    fn line_done(&mut self, line: &[u8]) {
        let line = trim_eol(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        self.events += 1;
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        if let Ok(chunk) = serde_json::from_slice::<Chunk>(data) {
            if chunk.usage.is_some() {
                self.usage = chunk.usage;
            }
            if chunk.choices.iter().any(|c| c.finish_reason.is_some()) {
                self.finished = true;
            }
        }
    }
}

fn trim_eol(mut line: &[u8]) -> &[u8] {
    while let [rest @ .., b'\n' | b'\r'] = line {
        line = rest;
    }
    line
}

/// The value of `stream_options` that asks the provider for usage.
const ASK_USAGE: &[u8] = br#"{"include_usage":true}"#;

/// Sets `stream_options.include_usage` in the body of a streamed request,
/// every other byte kept. False, and nothing changed, when it needs no change
/// (not a stream, or usage already asked) or cannot take one without
/// rewriting what the client wrote (a `stream_options` of its own).
pub fn ask_for_usage(doc: &mut Document) -> bool {
    let Some(tree) = doc.tree() else {
        return false;
    };
    if tree.get("stream") != Some(&Json::Bool(true)) || tree.get("stream_options").is_some() {
        return false;
    }
    doc.set_text("stream_options", ASK_USAGE)
}

/// Longest incomplete SSE event held back by [`UsageStrip`]; past it the
/// stream passes as it is from there on.
const MAX_HELD_EVENT: usize = 256 * 1024;

/// Removes the usage-only chunk (`"choices":[]` with a `usage` object) from an
/// SSE stream as it passes: the filter asked the provider for usage on behalf
/// of a client that did not, and that client must see the stream it would
/// have seen. Events pass whole; the bytes of an incomplete one wait for its
/// end (bounded by one event).
#[derive(Debug, Default)]
pub struct UsageStrip {
    held: Vec<u8>,
    off: bool,
    /// Usage-only chunks removed.
    pub removed: u32,
}

#[derive(Deserialize)]
struct UsageOnly {
    choices: Vec<serde::de::IgnoredAny>,
    usage: Option<serde::de::IgnoredAny>,
}

impl UsageStrip {
    /// A strip at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bytes to pass on for the next piece of the stream; `end` flushes
    /// whatever is held.
    pub fn pass(&mut self, chunk: &[u8], end: bool) -> Vec<u8> {
        if self.off {
            return chunk.to_vec();
        }
        self.held.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(self.held.len());
        let mut start = 0;
        let mut at = 0;
        for line in self.held.split_inclusive(|b| *b == b'\n') {
            at += line.len();
            let complete = line.last() == Some(&b'\n');
            if complete && trim_eol(line).is_empty() {
                let event = self.held.get(start..at).unwrap_or_default();
                if is_usage_only(event) {
                    self.removed = self.removed.saturating_add(1);
                } else {
                    out.extend_from_slice(event);
                }
                start = at;
            }
        }
        let rest = self.held.get(start..).unwrap_or_default();
        if end || rest.len() > MAX_HELD_EVENT {
            self.off = !end;
            out.extend_from_slice(rest);
            self.held.clear();
        } else {
            let rest = rest.to_vec();
            self.held = rest;
        }
        out
    }
}

/// An SSE event whose one `data:` line is a usage-only chunk.
fn is_usage_only(event: &[u8]) -> bool {
    let mut data = None;
    for line in event.split(|b| *b == b'\n') {
        let Some(d) = trim_eol(line).strip_prefix(b"data:") else {
            continue;
        };
        if data.is_some() {
            return false;
        }
        data = Some(d);
    }
    data.and_then(|d| serde_json::from_slice::<UsageOnly>(d).ok())
        .is_some_and(|c| c.choices.is_empty() && c.usage.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_only_chunk_is_removed_wherever_the_stream_splits() {
        let without: String = STREAM
            .split_inclusive("\n\n")
            .filter(|e| !e.contains("\"choices\":[]"))
            .collect();
        assert_eq!(without.len() + 72, STREAM.len());
        for split in 0..=STREAM.len() {
            for second in [split, (split + 37).min(STREAM.len())] {
                let mut strip = UsageStrip::new();
                let b = STREAM.as_bytes();
                let mut out = strip.pass(&b[..split], false);
                out.extend(strip.pass(&b[split..second], false));
                out.extend(strip.pass(&b[second..], true));
                assert_eq!(String::from_utf8(out).unwrap(), without, "{split} {second}");
                assert_eq!(strip.removed, 1);
            }
        }
    }

    #[test]
    fn other_events_pass_as_they_are() {
        for stream in [
            "data: {\"choices\":[],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":1}}\n\n",
            ": comment\r\n\r\ndata: [DONE]\r\n\r\n",
            "event: x\ndata: {\"choices\":[]}\ndata: {}\n\n",
            "data: {\"choices\":[],\"usage\":{}}",
        ] {
            let mut strip = UsageStrip::new();
            assert_eq!(
                strip.pass(stream.as_bytes(), true),
                stream.as_bytes(),
                "{stream}"
            );
        }
        // CRLF events are recognised too.
        let mut strip = UsageStrip::new();
        let crlf =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\r\n\r\ndata: [DONE]\r\n\r\n";
        assert_eq!(strip.pass(crlf.as_bytes(), false), b"data: [DONE]\r\n\r\n");
    }

    #[test]
    fn usage_is_asked_of_streams_that_did_not() {
        for (body, want) in [
            (
                r#" {"stream":true,"model":"m"}"#,
                Some(r#" {"stream":true,"model":"m","stream_options":{"include_usage":true}}"#),
            ),
            (r#"{"stream":false}"#, None),
            (r#"{"model":"m"}"#, None),
            (r#"{"stream":true,"stream_options":null}"#, None),
            (
                r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
                None,
            ),
            (
                r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
                None,
            ),
        ] {
            let mut doc = Document::parse(body.as_bytes().to_vec());
            let got = ask_for_usage(&mut doc).then(|| doc.into_bytes());
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{body}");
            if let Some(got) = got {
                let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
                assert_eq!(v["stream_options"]["include_usage"], true);
            }
        }
    }

    #[test]
    fn an_endless_event_is_let_through() {
        let mut strip = UsageStrip::new();
        let big = vec![b'x'; MAX_HELD_EVENT + 1];
        assert!(strip.pass(b"data: ", false).is_empty());
        let out = strip.pass(&big, false);
        assert_eq!(out.len(), big.len() + 6);
        assert_eq!(strip.pass(b"\n\n", false), b"\n\n");
    }

    #[test]
    fn reads_json_usage() {
        let body =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;
        assert_eq!(
            from_json(body),
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 5
            })
        );
        assert_eq!(
            from_json(br#"{"usage":{"prompt_tokens":3,"total_tokens":3}}"#),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 0
            })
        );
        assert_eq!(from_json(br#"{"usage":null}"#), None);
        assert_eq!(from_json(b"{"), None);
    }

    #[test]
    fn a_parsed_answer_gives_the_same_usage() {
        for body in [
            r#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":5}}"#,
            r#"{"usage":{"prompt_tokens":3}}"#,
            r#"{"usage":null}"#,
            r#"{"usage":{"prompt_tokens":"3"}}"#,
            r#"{"choices":[]}"#,
            r#"[1]"#,
        ] {
            let tree: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(from_value(&tree), from_json(body.as_bytes()), "{body}");
        }
    }

    const STREAM: &str =
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

    #[test]
    fn scans_a_stream_split_anywhere() {
        for split in 1..STREAM.len() {
            let mut s = SseScanner::new();
            let (a, b) = STREAM.as_bytes().split_at(split);
            s.feed(a);
            s.feed(b);
            assert_eq!(
                s.usage,
                Some(Usage {
                    prompt_tokens: 9,
                    completion_tokens: 2
                }),
                "split at {split}"
            );
            assert!(s.finished && s.done);
            assert_eq!(s.events, 5);
        }
    }

    #[test]
    fn crlf_and_no_space_after_colon() {
        let mut s = SseScanner::new();
        s.feed(b"data:{\"choices\":[{\"finish_reason\":\"length\"}]}\r\n\r\ndata:[DONE]\r\n");
        assert!(s.finished && s.done);
        assert_eq!(s.usage, None);
    }

    #[test]
    fn unfinished_stream_is_not_done() {
        let mut s = SseScanner::new();
        s.feed(b"data: {\"choices\":[{\"finish_reason\":null}]}\n\ndata: [DO");
        assert!(!s.finished && !s.done);
    }

    #[test]
    fn overlong_line_is_skipped_with_bounded_memory() {
        let mut s = SseScanner::new();
        s.feed(b"data: ");
        for _ in 0..10 {
            s.feed(&vec![b'x'; MAX_LINE / 4]);
        }
        assert!(s.line.len() <= MAX_LINE);
        s.feed(b"\ndata: [DONE]\n");
        assert!(s.done);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    fn event() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u64..1_000_000, 0u64..1_000_000).prop_map(|(p, c)| format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c}}}}}\n\n"
            )),
            fuzz::text().prop_map(|t| format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":{}}},\"finish_reason\":null}}]}}\r\n\r\n",
                serde_json::to_string(&t).unwrap()
            )),
            Just("data:{\"choices\":[{\"finish_reason\":\"stop\"}]}\n\n".to_string()),
            Just(": ping\n\nevent: x\nid: 1\n\n".to_string()),
            fuzz::text().prop_map(|t| format!("data: {}\n\n", t.replace('\n', " "))),
        ]
    }

    fn scan(chunks: &[&[u8]]) -> (Option<Usage>, bool, bool, u64) {
        let mut s = SseScanner::new();
        for c in chunks {
            s.feed(c);
            assert!(s.line.len() <= MAX_LINE);
        }
        (s.usage, s.finished, s.done, s.events)
    }

    proptest! {
        #![proptest_config(fuzz::config(128))]

        /// However the stream is cut, the scanner reads the same usage,
        /// finish, end and event count as from one piece.
        #[test]
        fn cutting_the_stream_changes_nothing(events in prop::collection::vec(event(), 0..8), done: bool, cuts in prop::collection::vec(any::<usize>(), 0..8)) {
            let mut stream = events.concat();
            if done {
                stream.push_str("data: [DONE]\n\n");
            }
            let bytes = stream.as_bytes();
            let whole = scan(&[bytes]);
            prop_assert_eq!(whole.2, done);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                pieces.push(&bytes[from..c]);
                from = c;
            }
            prop_assert_eq!(scan(&pieces), whole);
        }

        /// Endless input without a newline, fed in any sizes, keeps the
        /// buffer within one line; the stream after it is still read.
        #[test]
        fn endless_lines_keep_memory_bounded(sizes in prop::collection::vec(1usize..200_000, 1..24), byte in 0u8..255) {
            let byte = if byte == b'\n' { b'x' } else { byte };
            let mut s = SseScanner::new();
            s.feed(b"data: ");
            for n in sizes {
                s.feed(&vec![byte; n]);
                prop_assert!(s.line.len() <= MAX_LINE);
                prop_assert!(s.line.capacity() <= 2 * MAX_LINE);
            }
            s.feed(b"\ndata: [DONE]\n");
            prop_assert!(s.done);
        }

        /// Arbitrary bytes: no panic, and a JSON body's usage reads the same
        /// from the bytes and from the parsed tree.
        #[test]
        fn any_bytes_scan(bytes in prop::collection::vec(any::<u8>(), 0..512), doc in fuzz::doc(false), seed: u64) {
            let mut s = SseScanner::new();
            s.feed(&bytes);
            let body = fuzz::mutated(&doc, seed);
            if let Ok(tree) = serde_json::from_slice::<serde_json::Value>(&body) {
                prop_assert_eq!(from_value(&tree), from_json(&body));
            }
        }
    }
}

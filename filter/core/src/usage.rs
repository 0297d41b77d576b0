//! Token usage as the provider reports it, from a JSON answer or from the SSE
//! stream of a streamed answer (the final chunk carries `usage` when the client
//! asked with `stream_options.include_usage`), read without holding the stream.

use serde::Deserialize;

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

#[cfg(test)]
mod tests {
    use super::*;

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

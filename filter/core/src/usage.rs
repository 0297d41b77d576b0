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

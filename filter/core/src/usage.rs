//! Token usage as the provider reports it in a JSON answer, read in the
//! words of the call's dialect ([`crate::dialect::answer::Answer::usage`]),
//! and the request edit that asks a chat stream for it
//! (`stream_options.include_usage`: the final chunk then carries `usage`,
//! which the stream reading in `sse` picks up).

use serde::Deserialize;
use serde_json::Value;

use crate::dialect::answer::Answer;
use crate::json::{Document, Json};

/// Tokens of one call, whatever dialect reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens, those read from the provider's prompt cache included.
    pub prompt_tokens: u64,
    /// Output tokens (absent for embeddings).
    pub completion_tokens: u64,
    /// Input tokens the provider read from its prompt cache.
    pub cached_tokens: u64,
}

/// A `usage` object's counts under every name a dialect gives them, each
/// apart: the call's dialect says which ones count. OpenAI's chat,
/// completions and embeddings write `prompt_tokens`, `completion_tokens`,
/// `prompt_tokens_details`; OpenAI Responses `input_tokens`,
/// `output_tokens`, `input_tokens_details`; Anthropic Messages
/// `input_tokens` without the cached ones, `cache_read_input_tokens`,
/// `cache_creation_input_tokens`, `output_tokens`. A missing count is 0;
/// one that is no `u64` (null, a string, negative, fractional) is no usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Reported {
    /// OpenAI's input tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// OpenAI's output tokens.
    #[serde(default)]
    pub completion_tokens: u64,
    /// OpenAI's details of the input.
    #[serde(default)]
    pub prompt_tokens_details: Option<Details>,
    /// Responses' and Anthropic's input tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Responses' and Anthropic's output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Responses' details of the input.
    #[serde(default)]
    pub input_tokens_details: Option<Details>,
    /// Anthropic's input tokens read from its prompt cache.
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
    /// Anthropic's input tokens written to its prompt cache.
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
}

/// The details of a usage's input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Details {
    /// Input tokens read from the provider's prompt cache.
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl Reported {
    /// A `usage` object as the dialects write it; `None` when it is not one.
    pub fn from_value(usage: &Value) -> Option<Self> {
        Self::deserialize(usage).ok()
    }

    /// The cached tokens of `details`, 0 when it says none.
    pub fn cached(details: Option<Details>) -> u64 {
        details.and_then(|d| d.cached_tokens).unwrap_or(0)
    }
}

impl Usage {
    /// This usage with the fields `later` reports in place of its own: a
    /// stream that reports its usage over several events (Anthropic's input
    /// in `message_start`, its output in `message_delta`) adds up to one.
    pub fn updated_by(self, later: Usage) -> Usage {
        let pick = |a: u64, b: u64| if b > 0 { b } else { a };
        Usage {
            prompt_tokens: pick(self.prompt_tokens, later.prompt_tokens),
            completion_tokens: pick(self.completion_tokens, later.completion_tokens),
            cached_tokens: pick(self.cached_tokens, later.cached_tokens),
        }
    }
}

/// What the filter reads of a JSON answer: its usage, its `id` and its `model`.
#[derive(Debug, Default, Deserialize)]
pub struct Head {
    /// The answer's `usage`, read by the call's dialect.
    #[serde(skip)]
    pub usage: Option<Usage>,
    /// The answer's `usage` object, as written.
    #[serde(default, rename = "usage")]
    reported: Option<Reported>,
    /// The answer's `id` (a Responses response's is the one a later call
    /// continues).
    #[serde(default)]
    pub id: Option<String>,
    /// The model that answered, as the answer names it.
    #[serde(default)]
    pub model: Option<String>,
    /// The usage an API reports apart from `usage` (Gemini's
    /// `usageMetadata`), read by the call's dialect.
    #[serde(default, rename = "usageMetadata")]
    apart: Option<Value>,
    /// A Gemini answer's candidates, for their finish reasons.
    #[serde(default)]
    candidates: Vec<Candidate>,
    /// A chat answer's choices, for their finish reasons.
    #[serde(default)]
    choices: Vec<Choice>,
    /// A Messages answer's `stop_reason`.
    #[serde(default)]
    stop_reason: Option<String>,
    /// `response` for a Responses answer, whose `status` and
    /// `incomplete_details` say why it ended (any JSON: other answers may
    /// use the names for something else).
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    status: Option<Value>,
    #[serde(default)]
    incomplete_details: Option<Value>,
}

/// What the filter reads of a chat choice.
#[derive(Debug, Default, Deserialize)]
struct Choice {
    #[serde(default)]
    finish_reason: Option<String>,
}

/// What the filter reads of a Gemini candidate.
#[derive(Debug, Default, Deserialize)]
struct Candidate {
    #[serde(default, rename = "finishReason")]
    finish_reason: Option<String>,
}

/// Most finish reasons kept of one answer.
pub const MAX_FINISH_REASONS: usize = 8;

impl Head {
    /// Why the answer ended: each chat choice's `finish_reason`, a
    /// Messages answer's `stop_reason`, or a Responses answer's incomplete
    /// reason else its status (at most [`MAX_FINISH_REASONS`]).
    pub fn finish_reasons(&self) -> Vec<&str> {
        let response = self
            .object
            .as_ref()
            .is_some_and(|o| o == "response")
            .then(|| {
                self.incomplete_details
                    .as_ref()
                    .and_then(|d| d.get("reason"))
                    .and_then(Value::as_str)
                    .or_else(|| self.status.as_ref().and_then(Value::as_str))
            })
            .flatten();
        self.choices
            .iter()
            .filter_map(|c| c.finish_reason.as_deref())
            .chain(
                self.candidates
                    .iter()
                    .filter_map(|c| c.finish_reason.as_deref()),
            )
            .chain(self.stop_reason.as_deref())
            .chain(response)
            .take(MAX_FINISH_REASONS)
            .collect()
    }
}

impl Head {
    /// The head with its usage read in the words of `dialect`.
    fn read_by(mut self, dialect: &dyn Answer) -> Self {
        self.usage = match &self.reported {
            Some(r) => Some(dialect.usage(r)),
            None => self.apart.as_ref().and_then(|m| dialect.usage_apart(m)),
        };
        self
    }
}

/// The usage and id of a JSON answer body of `dialect`, in one pass.
pub fn head_from_json(dialect: &dyn Answer, body: &[u8]) -> Head {
    serde_json::from_slice::<Head>(body)
        .unwrap_or_default()
        .read_by(dialect)
}

/// The usage and id of a JSON answer of `dialect` already parsed.
pub fn head_from_value(dialect: &dyn Answer, answer: &Value) -> Head {
    Head::deserialize(answer)
        .unwrap_or_default()
        .read_by(dialect)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;

    const ANY: &dyn Answer = &crate::dialect::other::Other;

    #[test]
    fn finish_reasons_of_each_dialect() {
        let chat = br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":"x"}},{"finish_reason":"length"},{}]}"#;
        assert_eq!(
            head_from_json(ANY, chat).finish_reasons(),
            ["stop", "length"]
        );
        let messages = br#"{"type":"message","stop_reason":"end_turn","content":[]}"#;
        assert_eq!(head_from_json(ANY, messages).finish_reasons(), ["end_turn"]);
        let done = br#"{"object":"response","status":"completed","incomplete_details":null}"#;
        assert_eq!(head_from_json(ANY, done).finish_reasons(), ["completed"]);
        let cut = br#"{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}"#;
        assert_eq!(
            head_from_json(ANY, cut).finish_reasons(),
            ["max_output_tokens"]
        );
        // Another answer's `status` is not a finish reason, and never
        // costs the usage beside it.
        let other = br#"{"status":400,"usage":{"prompt_tokens":3}}"#;
        assert!(head_from_json(ANY, other).finish_reasons().is_empty());
        assert_eq!(
            head_from_json(ANY, other).usage.map(|u| u.prompt_tokens),
            Some(3)
        );
        assert!(head_from_json(ANY, br#"{"output":[]}"#)
            .finish_reasons()
            .is_empty());
        let many = format!(
            r#"{{"choices":[{}]}}"#,
            vec![r#"{"finish_reason":"stop"}"#; 20].join(",")
        );
        assert_eq!(
            head_from_json(ANY, many.as_bytes()).finish_reasons().len(),
            MAX_FINISH_REASONS
        );
    }

    /// The `usage` of a JSON answer body read by a path of another shape,
    /// which takes every dialect's names.
    fn from_json(body: &[u8]) -> Option<Usage> {
        of(Dialect::Other, body)
    }

    /// The `usage` of a JSON answer body of `dialect`.
    fn of(dialect: Dialect, body: &[u8]) -> Option<Usage> {
        head_from_json(dialect.answer(), body).usage
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
    fn reads_json_usage() {
        let body =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;
        assert_eq!(
            from_json(body),
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 5,
                cached_tokens: 0
            })
        );
        assert_eq!(
            from_json(br#"{"usage":{"prompt_tokens":3,"total_tokens":3}}"#),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 0,
                cached_tokens: 0
            })
        );
        assert_eq!(from_json(br#"{"usage":null}"#), None);
        assert_eq!(from_json(b"{"), None);
    }

    #[test]
    fn reads_each_dialects_usage() {
        // Each in its own dialect, and as a path of another shape reads it.
        let u = |d: Dialect, s: &str| {
            assert_eq!(of(d, s.as_bytes()), from_json(s.as_bytes()), "{s}");
            of(d, s.as_bytes()).unwrap()
        };
        let want = |p, c, cached| Usage {
            prompt_tokens: p,
            completion_tokens: c,
            cached_tokens: cached,
        };
        assert_eq!(
            u(
                Dialect::Chat,
                r#"{"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#
            ),
            want(10, 2, 8)
        );
        assert_eq!(
            u(
                Dialect::Responses,
                r#"{"object":"response","usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":13}}"#
            ),
            want(10, 3, 4)
        );
        assert_eq!(
            u(
                Dialect::Messages,
                r#"{"type":"message","usage":{"input_tokens":2,"cache_read_input_tokens":7,"cache_creation_input_tokens":1,"output_tokens":5}}"#
            ),
            want(10, 5, 7)
        );
        assert_eq!(
            u(
                Dialect::Messages,
                r#"{"usage":{"input_tokens":2,"cache_read_input_tokens":null,"output_tokens":5}}"#
            ),
            want(2, 5, 0)
        );
        // A stream's usage over two events adds up.
        let start = want(10, 1, 7);
        assert_eq!(start.updated_by(want(0, 42, 0)), want(10, 42, 7));
    }

    /// What each dialect's answers read as, odd ones included: a count
    /// that is null, a string, negative, fractional or past `u64` costs
    /// the whole head; a missing count is 0; null or missing details are no
    /// cached tokens; Anthropic's cache counts add to the input, saturating.
    #[test]
    fn pins_what_each_dialects_usage_reads_as() {
        let want = |p, c, cached| {
            Some(Usage {
                prompt_tokens: p,
                completion_tokens: c,
                cached_tokens: cached,
            })
        };
        let max = u64::MAX;
        let big = format!(
            r#"{{"usage":{{"input_tokens":{max},"cache_read_input_tokens":5,"output_tokens":1}}}}"#
        );
        let past = r#"{"usage":{"prompt_tokens":18446744073709551616}}"#;
        let openai = [Dialect::Chat, Dialect::Completions, Dialect::Embeddings];
        let all = [
            Dialect::Chat,
            Dialect::Completions,
            Dialect::Embeddings,
            Dialect::Responses,
            Dialect::Messages,
        ];
        let (responses, messages) = ([Dialect::Responses], [Dialect::Messages]);
        let cases: [(&[Dialect], &str, Option<Usage>); 19] = [
            (&all, r#"{"usage":{}}"#, want(0, 0, 0)),
            (
                &openai,
                r#"{"usage":{"completion_tokens":4}}"#,
                want(0, 4, 0),
            ),
            (&all, r#"{"usage":{"prompt_tokens":null}}"#, None),
            (&all, r#"{"usage":{"prompt_tokens":"3"}}"#, None),
            (&all, r#"{"usage":{"prompt_tokens":-1}}"#, None),
            (&all, r#"{"usage":{"prompt_tokens":1.5}}"#, None),
            (&all, r#"{"usage":{"prompt_tokens":3.0}}"#, None),
            (&all, past, None),
            (&all, r#"{"usage":"many"}"#, None),
            (
                &openai,
                r#"{"usage":{"prompt_tokens":2,"prompt_tokens_details":null}}"#,
                want(2, 0, 0),
            ),
            (
                &openai,
                r#"{"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":null}}}"#,
                want(2, 0, 0),
            ),
            (
                &all,
                r#"{"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":"1"}}}"#,
                None,
            ),
            (
                &openai,
                r#"{"usage":{"prompt_tokens":2,"prompt_tokens_details":{"audio_tokens":1}}}"#,
                want(2, 0, 0),
            ),
            (
                &responses,
                r#"{"usage":{"input_tokens":2,"input_tokens_details":null,"output_tokens":1}}"#,
                want(2, 1, 0),
            ),
            (&all, r#"{"usage":{"input_tokens":null}}"#, None),
            (
                &messages,
                r#"{"usage":{"input_tokens":2,"cache_creation_input_tokens":null,"output_tokens":1}}"#,
                want(2, 1, 0),
            ),
            (
                &all,
                r#"{"usage":{"input_tokens":2,"cache_creation_input_tokens":"3"}}"#,
                None,
            ),
            (&messages, big.as_str(), want(max, 1, 5)),
            (&responses, big.as_str(), want(max, 1, 0)),
        ];
        for (dialects, body, usage) in cases {
            for d in dialects {
                assert_eq!(of(*d, body.as_bytes()), usage, "{d:?} {body}");
            }
            if dialects != [Dialect::Responses] {
                assert_eq!(from_json(body.as_bytes()), usage, "{body}");
            }
        }
        // A count that costs the usage costs the id and model beside it.
        let head = head_from_json(
            ANY,
            br#"{"id":"a","model":"m","usage":{"prompt_tokens":"3"}}"#,
        );
        assert_eq!((head.id, head.model), (None, None));
    }

    /// Each dialect counts its own names only; a path of another shape
    /// counts every dialect's, as all dialects did before they each read
    /// their own (where two names for one count met, that was no usage).
    #[test]
    fn a_dialect_counts_its_own_names() {
        let chat_named = br#"{"usage":{"prompt_tokens":4,"completion_tokens":2}}"#;
        let anthropic_named =
            br#"{"usage":{"input_tokens":4,"cache_read_input_tokens":3,"output_tokens":2}}"#;
        let want = |p, c, cached| {
            Some(Usage {
                prompt_tokens: p,
                completion_tokens: c,
                cached_tokens: cached,
            })
        };
        assert_eq!(of(Dialect::Chat, chat_named), want(4, 2, 0));
        assert_eq!(of(Dialect::Messages, chat_named), want(0, 0, 0));
        assert_eq!(of(Dialect::Responses, chat_named), want(0, 0, 0));
        assert_eq!(of(Dialect::Chat, anthropic_named), want(0, 0, 0));
        assert_eq!(of(Dialect::Responses, anthropic_named), want(4, 2, 0));
        assert_eq!(of(Dialect::Messages, anthropic_named), want(7, 2, 3));
        assert_eq!(from_json(chat_named), want(4, 2, 0));
        assert_eq!(from_json(anthropic_named), want(7, 2, 3));
        let both = br#"{"usage":{"prompt_tokens":4,"input_tokens":5}}"#;
        assert_eq!(of(Dialect::Chat, both), want(4, 0, 0));
        assert_eq!(of(Dialect::Messages, both), want(5, 0, 0));
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
            assert_eq!(
                head_from_value(ANY, &tree).usage,
                from_json(body.as_bytes()),
                "{body}"
            );
        }
    }

    #[test]
    fn a_gemini_answer_is_read_from_usage_metadata_and_candidates() {
        let body = br#"{"candidates":[{"content":{"parts":[{"text":"x"}]},"finishReason":"STOP"},{"finishReason":"MAX_TOKENS"}],
            "usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":4,"cachedContentTokenCount":6,"thoughtsTokenCount":2}}"#;
        let gemini = Dialect::Gemini.answer();
        let head = head_from_json(gemini, body);
        assert_eq!(
            head.usage,
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 6,
                cached_tokens: 6
            })
        );
        assert_eq!(head.finish_reasons(), ["STOP", "MAX_TOKENS"]);
        // Another dialect reads no usage there.
        assert_eq!(head_from_json(ANY, body).usage, None);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    proptest! {
        #![proptest_config(fuzz::config(128))]

        /// A JSON body's usage reads the same from the bytes and from the
        /// parsed tree.
        #[test]
        fn any_body_reads_alike(doc in fuzz::doc(false), seed: u64) {
            let body = fuzz::mutated(&doc, seed);
            if let Ok(tree) = serde_json::from_slice::<serde_json::Value>(&body) {
                for d in crate::dialect::Dialect::names().filter_map(crate::dialect::Dialect::named) {
                    let d = d.answer();
                    prop_assert_eq!(head_from_value(d, &tree).usage, head_from_json(d, &body).usage);
                }
            }
        }
    }
}

//! What a request says that routing's rules and the token estimate read:
//! the requested model, whether it declares tools or asks for a stream, and
//! the prompt's estimated size, read once from the body the walk parsed.
//! Where each API keeps these is dialect knowledge, so it is read here; the
//! estimate's policy (the weights by script, the calibration) stays in
//! [`crate::tokens`], and the rules that compare it in routing's rules.

use super::prompt::Said;
use super::Dialect;
use crate::json::Json;
use crate::tokens;

/// What the rules look at in a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// The requested `model`, read in the same pass.
    pub model: Option<String>,
    /// Estimated prompt tokens: the text of the prompt as the call's
    /// dialect reads it out (`Request::prompt`:
    /// the system prompt, a bare prompt, each turn's text and content),
    /// weighed by script ([`crate::tokens`]), plus one per token id where
    /// token ids are given. A dialect without a prompt to read out
    /// (embeddings, a path of another shape) counts every dialect's prompt
    /// fields: `messages` contents, `prompt`, `input`, `instructions` and
    /// `system`. Uncalibrated: see [`Features::calibrated`].
    pub prompt_tokens: u64,
    /// Every part of the prompt is counted in `prompt_tokens`: no tools
    /// (whose schemas the provider counts) and no image, audio or file part.
    /// Only such a call teaches the calibration.
    pub measured: bool,
    /// The request declares `tools` (or legacy `functions`).
    pub tools: bool,
    /// The request asks for a stream.
    pub stream: bool,
}

impl Features {
    /// Reads the features of a JSON request body of `dialect`; `None` when
    /// it is not a JSON object or a known field has an impossible type.
    pub fn from_body(dialect: Dialect, body: &[u8]) -> Option<Self> {
        Self::from_json(dialect, &Json::parse(body)?)
    }

    /// Reads the features of a parsed request body of `dialect`; `None` when
    /// it is not an object, names a known field twice (readers disagree on
    /// which counts) or gives one an impossible type.
    pub fn from_json(dialect: Dialect, body: &Json) -> Option<Self> {
        let Json::Object(members) = body else {
            return None;
        };
        let mut seen = [false; KNOWN.len()];
        let mut features = Self::default();
        // Every dialect's prompt fields, for a dialect without a prompt to
        // read out; the messages are checked whichever reads them.
        let mut any = Text::default();
        for (name, value) in members {
            let Some(i) = KNOWN.iter().position(|k| k == name) else {
                continue;
            };
            if seen.get(i).copied().unwrap_or(true) {
                return None;
            }
            if let Some(s) = seen.get_mut(i) {
                *s = true;
            }
            match (name.as_str(), value) {
                (_, Json::Null) => {}
                ("model", Json::String(m)) => features.model = Some(m.clone()),
                ("model", _) => return None,
                ("messages", Json::Array(messages)) => {
                    for m in messages {
                        any.add(message_text(m)?);
                    }
                }
                ("messages", _) => return None,
                // Chat and embeddings prompts, Responses' input (a string
                // or items) and instructions, Anthropic's system prompt.
                ("prompt" | "input" | "instructions" | "system", v) => any.add(Text::of(v)),
                ("tools" | "functions", v) => features.tools |= non_empty(v),
                ("stream", v) => features.stream = matches!(v, Json::Bool(true)),
                _ => {}
            }
        }
        let text = match dialect.request().prompt(body) {
            Some(prompt) => prompt.fold(Text::default(), |mut text, said| {
                text.add(said_text(said));
                text
            }),
            None => any,
        };
        features.prompt_tokens = text.tokens();
        features.measured = !features.tools && !text.unmeasured;
        Some(features)
    }
}

/// The text of one part of a prompt as the dialect reads it out: the
/// system prompt, a bare prompt, or a turn (of which its `text` and
/// `content` count: one with neither, a tool call or an image alone, is not
/// measured).
fn said_text(said: Said<'_>) -> Text {
    match said {
        Said::System(v) | Said::Bare(Some(v)) | Said::Turn(v) => Text::of(v),
        Said::Bare(None) | Said::Parts { parts: None, .. } => Text::default(),
        Said::Parts { parts: Some(v), .. } => Text::of(v),
    }
}

/// The request fields the features are read from.
const KNOWN: [&str; 9] = [
    "model",
    "messages",
    "prompt",
    "input",
    "instructions",
    "system",
    "tools",
    "functions",
    "stream",
];

/// The text of one chat message's `content`; `None` when the message is not
/// an object or names `content` twice.
fn message_text(message: &Json) -> Option<Text> {
    if !matches!(message, Json::Object(_)) {
        return None;
    }
    let mut contents = message.members("content");
    let text = contents.next().map(Text::of).unwrap_or_default();
    contents.next().is_none().then_some(text)
}

/// Estimated tokens of one chat message, by the rule of
/// [`Features::prompt_tokens`] (its content weighed by script, rounded up,
/// plus one per token id), with the names and arguments of its tool calls
/// counted as text too: shaping weighs messages one by one.
pub(crate) fn message_tokens(message: &Json) -> u64 {
    let mut text = message.get("content").map(Text::of).unwrap_or_default();
    if let Some(Json::Array(calls)) = message.get("tool_calls") {
        for function in calls.iter().filter_map(|c| c.get("function")) {
            for part in ["name", "arguments"] {
                if let Some(v @ Json::String(_)) = function.get(part) {
                    text.add(Text::of(v));
                }
            }
        }
    }
    text.tokens()
}

/// Estimated tokens of a JSON value by the rule of
/// [`Features::prompt_tokens`]: its strings (in objects, `text` and
/// `content`) weighed by script, rounded up, plus one per token id.
pub(crate) fn text_tokens(value: &Json) -> u64 {
    Text::of(value).tokens()
}

/// True for a non-empty array or object; any other value is false.
fn non_empty(v: &Json) -> bool {
    match v {
        Json::Array(items) => !items.is_empty(),
        Json::Object(members) => !members.is_empty(),
        _ => false,
    }
}

/// Weight of text (thousandths of a token, [`crate::tokens`]) and count of
/// token ids in a JSON value: strings count, integers are token ids, arrays
/// are walked, and in objects only `text` (a content part or block) and
/// `content` (a Responses input item, an Anthropic tool result) count, so
/// image URLs and audio never do (an object with neither is `unmeasured`).
#[derive(Debug, Default, Clone, Copy)]
struct Text {
    milli: u64,
    tokens: u64,
    unmeasured: bool,
}

impl Text {
    fn of(v: &Json) -> Self {
        match v {
            Json::String(s) => Self {
                milli: tokens::milli_tokens(s),
                ..Self::default()
            },
            // A canonical number with a negative exponent has a fraction.
            Json::Number(n) if !n.contains("e-") => Self {
                tokens: 1,
                ..Self::default()
            },
            Json::Array(items) => items.iter().fold(Self::default(), |mut t, i| {
                t.add(Self::of(i));
                t
            }),
            Json::Object(_) => {
                let mut parts = v.members("text").chain(v.members("content")).peekable();
                let unmeasured = parts.peek().is_none();
                parts.fold(
                    Self {
                        unmeasured,
                        ..Self::default()
                    },
                    |mut t, i| {
                        t.add(Self::of(i));
                        t
                    },
                )
            }
            _ => Self::default(),
        }
    }

    fn add(&mut self, other: Text) {
        self.milli = self.milli.saturating_add(other.milli);
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.unmeasured |= other.unmeasured;
    }

    /// The estimate: the text's weight rounded up, plus the token ids.
    fn tokens(&self) -> u64 {
        tokens::tokens(self.milli).saturating_add(self.tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Ratio;

    /// The features a path of another shape reads, which takes every
    /// dialect's prompt fields.
    fn f(body: &str) -> Features {
        Features::from_body(Dialect::Other, body.as_bytes()).unwrap()
    }

    /// The features of a body of `d`.
    fn of(d: Dialect, body: &str) -> Features {
        Features::from_body(d, body.as_bytes()).unwrap()
    }

    #[test]
    fn each_dialect_estimates_the_prompt_it_reads_out() {
        // Every field a dialect could keep a prompt in, each of eight
        // letters (two tokens).
        let body = r#"{"model":"m","system":"abcdefgh","instructions":"abcdefgh",
            "prompt":"abcdefgh","input":"abcdefgh",
            "messages":[{"role":"user","content":"abcdefgh"}],
            "contents":[{"role":"user","parts":[{"text":"abcdefgh"}]}]}"#;
        let tokens = |d| of(d, body).prompt_tokens;
        assert_eq!(tokens(Dialect::Chat), 2, "its messages");
        assert_eq!(tokens(Dialect::Completions), 2, "its prompt");
        assert_eq!(tokens(Dialect::Responses), 4, "instructions and input");
        assert_eq!(tokens(Dialect::Messages), 4, "system and messages");
        assert_eq!(tokens(Dialect::Other), 10, "every dialect's fields");
        assert_eq!(tokens(Dialect::Embeddings), 10, "no prompt read out");
        // As the prompt iterator reads them, a Responses input of items
        // and Anthropic's system blocks count alike.
        let items = r#"{"instructions":"abcd","input":[{"role":"user","content":"efgh"},
            {"type":"function_call_output","call_id":"c","output":"ignored"}]}"#;
        let x = of(Dialect::Responses, items);
        assert_eq!((x.prompt_tokens, x.measured), (2, false));
        assert_eq!(x.prompt_tokens, f(items).prompt_tokens);
        let blocks = r#"{"system":[{"type":"text","text":"abcd"}],"messages":[{"role":"user","content":[{"type":"text","text":"efgh"}]}]}"#;
        let x = of(Dialect::Messages, blocks);
        assert_eq!((x.prompt_tokens, x.measured), (2, true));
        // A turn with neither text nor content (a tool call alone) is not
        // measured: its tokens are not in the estimate.
        let call = r#"{"messages":[{"role":"user","content":"abcd"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}"#;
        assert!(!of(Dialect::Chat, call).measured);
        // The model, tools and stream, and what refuses a body, are read
        // alike by every dialect.
        for d in Dialect::names().filter_map(Dialect::named) {
            let x = of(d, r#"{"model":"m","tools":[{}],"stream":true}"#);
            assert_eq!(x.model.as_deref(), Some("m"), "{d:?}");
            assert!(x.tools && x.stream && !x.measured, "{d:?}");
            assert_eq!(
                Features::from_body(d, br#"{"messages":["hi"]}"#),
                None,
                "{d:?}"
            );
        }
    }

    #[test]
    fn estimates_chat_prompt_tokens() {
        let x = f(r#"{"model":"auto","messages":[
            {"role":"system","content":"12345678"},
            {"role":"user","content":[
                {"type":"text","text":"abcd"},
                {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}},
                {"type":"input_audio","input_audio":{"data":"AAAAAAAAAAAAAAAAAAAAAAAA","format":"wav"}},
                {"type":"text","text":"\u00e9\u00e9\u00e9\u00e9"}
            ]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"x","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","content":"1"}
        ]}"#);
        // Weighed by script: 8 digits 4, 4 letters 1, 4 accented letters 4
        // (each a character), 1 digit 0.5 → 9.5 → 10 tokens (a quarter per
        // character gave 5).
        assert_eq!(x.prompt_tokens, 10);
        assert_eq!(x.model.as_deref(), Some("auto"));
        assert!(!x.tools && !x.stream);
        // The image and audio parts are not counted: no sample to learn from.
        assert!(!x.measured);
        assert!(
            f(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}"#).measured
        );
        assert!(!f(r#"{"messages":[],"tools":[{"type":"function"}]}"#).measured);
    }

    #[test]
    fn estimates_completions_and_embeddings() {
        assert_eq!(f(r#"{"prompt":"abcdefgh"}"#).prompt_tokens, 2);
        assert_eq!(f(r#"{"prompt":["abcd","efgh"]}"#).prompt_tokens, 2);
        assert_eq!(f(r#"{"prompt":[1,2,3]}"#).prompt_tokens, 3);
        assert_eq!(f(r#"{"prompt":[[1,2],[3]]}"#).prompt_tokens, 3);
        assert_eq!(f(r#"{"input":"abcdefghi"}"#).prompt_tokens, 3);
        assert_eq!(f(r#"{"input":["ab","cd"]}"#).prompt_tokens, 1);
        assert_eq!(f(r#"{"model":"m"}"#).prompt_tokens, 0);
        assert_eq!(f(r#"{"messages":[{"role":"user"}]}"#).prompt_tokens, 0);
    }

    #[test]
    fn estimates_responses_and_messages_prompt_tokens() {
        // Responses: instructions, and input as a string or as items.
        let x = f(r#"{"model":"m","instructions":"abcd","input":"efgh"}"#);
        assert_eq!(x.prompt_tokens, 2);
        let x = f(r#"{"instructions":"abcd","input":[
            {"role":"user","content":"efgh"},
            {"type":"message","role":"user","content":[{"type":"input_text","text":"ijkl"},
                {"type":"input_image","image_url":"data:image/png;base64,AAAAAAAAAAAAAAAA"}]},
            {"type":"function_call_output","call_id":"c","output":"ignored"}
        ],"stream":true}"#);
        assert_eq!(x.prompt_tokens, 3);
        assert!(x.stream);
        // Messages: the system prompt (a string or blocks) and content blocks.
        let x = f(
            r#"{"model":"claude","max_tokens":9,"system":[{"type":"text","text":"abcd"}],
            "messages":[{"role":"user","content":[{"type":"text","text":"efgh"},
                {"type":"tool_result","tool_use_id":"t","content":"ijkl"}]},
                {"role":"assistant","content":"mnop"}],
            "tools":[{"name":"f","input_schema":{}}]}"#,
        );
        assert_eq!(x.prompt_tokens, 4);
        assert!(x.tools);
        assert_eq!(f(r#"{"system":"abcdefgh"}"#).prompt_tokens, 2);
    }

    #[test]
    fn estimates_non_latin_text_by_script() {
        // 13 ideographs and 2 fullwidth marks: a token each, where a quarter
        // per character said 4.
        let x = f(r#"{"messages":[{"role":"user","content":"今天天气很好，我们一起去公园。"}]}"#);
        assert_eq!(x.prompt_tokens, 15);
        let x = f(r#"{"model":"m","messages":[{"role":"user","content":"今天天气很好，我们一起去公园。"}]}"#)
            .calibrated(Ratio::from_milli(500));
        assert_eq!(x.prompt_tokens, 8);
        assert_eq!(x.model.as_deref(), Some("m"));
    }

    #[test]
    fn reads_tools_and_stream() {
        let x = f(r#"{"tools":[{"type":"function","function":{"name":"f"}}],"stream":true}"#);
        assert!(x.tools && x.stream);
        assert!(f(r#"{"functions":[{"name":"f"}]}"#).tools);
        for body in [
            r#"{"tools":[]}"#,
            r#"{"tools":null}"#,
            r#"{"stream":false}"#,
            r#"{"stream":"true"}"#,
            r#"{"stream":null,"tools":"x"}"#,
        ] {
            let x = f(body);
            assert!(!x.tools && !x.stream, "{body}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_request_object() {
        for body in [
            "",
            "[]",
            r#"["m",[]]"#,
            "not json",
            r#"{"model":3}"#,
            r#"{"messages":"x"}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"a""#,
            r#"{"messages":[null]}"#,
            r#"{"messages":["hi"]}"#,
            r#"{"messages":[{"content":"a","content":"b"}]}"#,
            r#"{"stream":true,"stream":false}"#,
        ] {
            assert_eq!(
                Features::from_body(Dialect::Other, body.as_bytes()),
                None,
                "{body}"
            );
        }
        assert!(Features::from_body(Dialect::Other, b"  {}  ").is_some());
    }

    #[test]
    fn counts_text_and_token_ids_of_the_parsed_body() {
        for (body, tokens) in [
            (r#"{"prompt":[1,2,3]}"#, 3),
            (r#"{"prompt":[10,-5,12345678901]}"#, 3),
            (r#"{"prompt":[1.5,true,null]}"#, 0),
            (r#"{"prompt":"abcdefgh"}"#, 2),
            (r#"{"input":["abcd",[7]]}"#, 2),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"abcdefghabcdefgh"}}]}]}"#,
                1,
            ),
            (r#"{"messages":null,"model":null,"tools":null}"#, 0),
        ] {
            let f = Features::from_body(Dialect::Other, body.as_bytes()).unwrap();
            assert_eq!(f.prompt_tokens, tokens, "{body}");
        }
        let f = Features::from_body(Dialect::Other, br#"{"tools":[{}],"stream":1}"#).unwrap();
        assert!(f.tools && !f.stream);
        let f = Features::from_body(Dialect::Other, br#"{"functions":{},"stream":true}"#).unwrap();
        assert!(!f.tools && f.stream);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// The features of a body do not depend on its spelling, and any body
        /// is read or refused without a panic.
        #[test]
        fn features_ignore_spelling(doc in fuzz::doc(true), a: u64, b: u64) {
            for d in Dialect::names().filter_map(Dialect::named) {
                let fa = Features::from_body(d, doc.spell(a).as_bytes());
                prop_assert_eq!(Features::from_body(d, doc.spell(b).as_bytes()), fa, "{:?}", d);
                let _ = Features::from_body(d, &fuzz::mutated(&doc, a));
            }
        }
    }
}

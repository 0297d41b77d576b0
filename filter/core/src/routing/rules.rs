//! Model choice by request traits (the seeds' decision tree): `"model": "auto"`
//! or any alias becomes a concrete model by estimated prompt size, priority,
//! tools and streaming. The body is read once, without keeping its text.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::config::{Rule, When};
use crate::priority::Priority;

/// What the rules look at in a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// The requested `model`, read in the same pass.
    pub model: Option<String>,
    /// Estimated prompt tokens: a quarter of the characters of every message
    /// content (text parts of multimodal contents), `prompt` and `input`, plus
    /// one per token id where token ids are given.
    pub prompt_tokens: u64,
    /// The request declares `tools` (or legacy `functions`).
    pub tools: bool,
    /// The request asks for a stream.
    pub stream: bool,
}

impl Features {
    /// Reads the features of a JSON request body; `None` when it is not a JSON
    /// object or a known field has an impossible type.
    pub fn from_body(body: &[u8]) -> Option<Self> {
        if body.trim_ascii_start().first() != Some(&b'{') {
            return None;
        }
        let b: Body = serde_json::from_slice(body).ok()?;
        let mut text = Text::default();
        for m in b.messages.unwrap_or_default() {
            text.add(m.content);
        }
        text.add(b.prompt.unwrap_or_default());
        text.add(b.input.unwrap_or_default());
        Some(Self {
            model: b.model,
            prompt_tokens: text.chars.div_ceil(4).saturating_add(text.tokens),
            tools: b.tools.is_some_and(|p| p.0) || b.functions.is_some_and(|p| p.0),
            stream: b.stream.is_some_and(|f| f.0),
        })
    }
}

#[derive(Deserialize)]
struct Body {
    model: Option<String>,
    messages: Option<Vec<Message>>,
    prompt: Option<Text>,
    input: Option<Text>,
    tools: Option<NonEmpty>,
    functions: Option<NonEmpty>,
    stream: Option<Flag>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Text,
}

/// Characters of text and count of token ids in a JSON value: strings count,
/// integers are token ids, arrays are walked, and in objects only `text`
/// counts (a content part), so image URLs and audio never do.
#[derive(Debug, Default, Clone, Copy)]
struct Text {
    chars: u64,
    tokens: u64,
}

impl Text {
    fn add(&mut self, other: Text) {
        self.chars = self.chars.saturating_add(other.chars);
        self.tokens = self.tokens.saturating_add(other.tokens);
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("text, token ids or content parts")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
        Ok(Text {
            chars: v.chars().count() as u64,
            tokens: 0,
        })
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Text, E> {
        Ok(Text {
            chars: 0,
            tokens: 1,
        })
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Text, E> {
        Ok(Text {
            chars: 0,
            tokens: 1,
        })
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Text, E> {
        Ok(Text::default())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Text, E> {
        Ok(Text::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
        Ok(Text::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<Text, E> {
        Ok(Text::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
        let mut t = Text::default();
        while let Some(part) = seq.next_element::<Text>()? {
            t.add(part);
        }
        Ok(t)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
        let mut t = Text::default();
        while let Some(key) = map.next_key::<KeyIsText>()? {
            if key.0 {
                t.add(map.next_value::<Text>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(t)
    }
}

/// Whether an object key is `text`, without allocating the key.
struct KeyIsText(bool);

impl<'de> Deserialize<'de> for KeyIsText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeyIsText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyIsText, E> {
                Ok(KeyIsText(v == "text"))
            }
        }
        d.deserialize_str(V)
    }
}

/// True for a non-empty array (or object); any other value is false.
struct NonEmpty(bool);

impl<'de> Deserialize<'de> for NonEmpty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NonEmptyVisitor)
    }
}

struct NonEmptyVisitor;

impl<'de> Visitor<'de> for NonEmptyVisitor {
    type Value = NonEmpty;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NonEmpty, A::Error> {
        let mut any = false;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            any = true;
        }
        Ok(NonEmpty(any))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NonEmpty, A::Error> {
        let mut any = false;
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
            any = true;
        }
        Ok(NonEmpty(any))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<NonEmpty, E> {
        Ok(NonEmpty(false))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<NonEmpty, E> {
        Ok(NonEmpty(false))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<NonEmpty, E> {
        Ok(NonEmpty(false))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<NonEmpty, E> {
        Ok(NonEmpty(false))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<NonEmpty, E> {
        Ok(NonEmpty(false))
    }
    fn visit_unit<E: de::Error>(self) -> Result<NonEmpty, E> {
        Ok(NonEmpty(false))
    }
    fn visit_none<E: de::Error>(self) -> Result<NonEmpty, E> {
        Ok(NonEmpty(false))
    }
}

/// `true` only for JSON `true`; any other value is false, not an error.
struct Flag(bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Flag, E> {
                Ok(Flag(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Flag, A::Error> {
                NonEmptyVisitor.visit_seq(seq).map(|_| Flag(false))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Flag, A::Error> {
                NonEmptyVisitor.visit_map(map).map(|_| Flag(false))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_none<E: de::Error>(self) -> Result<Flag, E> {
                Ok(Flag(false))
            }
        }
        d.deserialize_any(V)
    }
}

impl When {
    /// Whether every condition holds for a call.
    pub fn matches(&self, requested: &str, f: &Features, priority: Priority) -> bool {
        self.models
            .as_ref()
            .is_none_or(|m| m.iter().any(|n| n == requested))
            && self
                .min_prompt_tokens
                .is_none_or(|min| f.prompt_tokens >= min)
            && self
                .max_prompt_tokens
                .is_none_or(|max| f.prompt_tokens <= max)
            && self
                .priorities
                .as_ref()
                .is_none_or(|p| p.contains(&priority))
            && self.tools.is_none_or(|t| t == f.tools)
            && self.stream.is_none_or(|s| s == f.stream)
    }
}

/// The model the first matching rule picks for a call that asked for
/// `requested`; `None` when no rule matches (keep the requested model).
pub fn choose_model(
    rules: &[Rule],
    requested: &str,
    features: &Features,
    priority: Priority,
) -> Option<String> {
    rules
        .iter()
        .find(|r| r.when.matches(requested, features, priority))
        .map(|r| r.model.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(body: &str) -> Features {
        Features::from_body(body.as_bytes()).unwrap()
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
        // 8 + 4 + 4 (é is one character) + 1 = 17 → 5 tokens.
        assert_eq!(x.prompt_tokens, 5);
        assert_eq!(x.model.as_deref(), Some("auto"));
        assert!(!x.tools && !x.stream);
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
        ] {
            assert_eq!(Features::from_body(body.as_bytes()), None, "{body}");
        }
        assert!(Features::from_body(b"  {}  ").is_some());
    }

    fn rule(when: When, model: &str) -> Rule {
        Rule {
            when,
            model: model.into(),
        }
    }

    #[test]
    fn first_matching_rule_wins() {
        let auto = Some(vec!["auto".to_string(), "smart".to_string()]);
        let rules = [
            rule(
                When {
                    models: auto.clone(),
                    min_prompt_tokens: Some(8_000),
                    ..When::default()
                },
                "big",
            ),
            rule(
                When {
                    models: auto.clone(),
                    priorities: Some(vec![Priority::P0]),
                    ..When::default()
                },
                "best",
            ),
            rule(
                When {
                    models: auto.clone(),
                    tools: Some(true),
                    stream: Some(false),
                    max_prompt_tokens: Some(100),
                    ..When::default()
                },
                "tooly",
            ),
            rule(
                When {
                    models: auto,
                    ..When::default()
                },
                "small",
            ),
        ];
        let feat = |prompt_tokens, tools, stream| Features {
            model: None,
            prompt_tokens,
            tools,
            stream,
        };
        let p1 = Priority::P1;
        for (requested, features, priority, want) in [
            ("auto", feat(9_000, false, false), p1, Some("big")),
            ("smart", feat(8_000, false, false), p1, Some("big")),
            (
                "auto",
                feat(7_999, false, false),
                Priority::P0,
                Some("best"),
            ),
            ("auto", feat(100, true, false), p1, Some("tooly")),
            ("auto", feat(101, true, false), p1, Some("small")),
            ("auto", feat(10, true, true), p1, Some("small")),
            ("auto", feat(0, false, false), Priority::P2, Some("small")),
            ("gpt-4o", feat(9_000, true, false), Priority::P0, None),
            ("AUTO", feat(0, false, false), p1, None),
        ] {
            assert_eq!(
                choose_model(&rules, requested, &features, priority).as_deref(),
                want,
                "{requested} {features:?} {priority}"
            );
        }
        assert_eq!(choose_model(&[], "auto", &Features::default(), p1), None);
    }

    #[test]
    fn empty_condition_matches_everything() {
        let rules = [rule(When::default(), "m")];
        assert_eq!(
            choose_model(&rules, "anything", &Features::default(), Priority::P2).as_deref(),
            Some("m")
        );
    }
}

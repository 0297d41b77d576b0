//! OpenAI chat completions (`…/chat/completions`), in its own words.

/// OpenAI chat completions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Chat;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

pub mod stream;

use super::prompt::{items, one, only_role, role, Prompt};
use super::request::{Prefix, Question, Request, Turns, PINNED_ROLES};
use crate::dialect::request::TokenField;
use crate::json::{Document, Json};

impl Request for Chat {
    fn samples(&self) -> bool {
        true
    }

    fn absent_temperature_is_default(&self) -> bool {
        true
    }

    fn output_cap_field(&self, configured: TokenField) -> Option<TokenField> {
        Some(configured)
    }

    fn shaped(&self) -> bool {
        true
    }

    fn turns_field(&self) -> Option<&'static str> {
        Some("messages")
    }

    /// Turns start at user messages; a tool answer joins its call's turn
    /// even when a user message sits between them; system and developer
    /// messages are pinned.
    fn turns(&self, messages: &[Json]) -> Option<Turns> {
        let roles = messages
            .iter()
            .map(only_role)
            .collect::<Option<Vec<&str>>>()?;
        let last_user = roles.iter().rposition(|r| *r == "user")?;
        let pinned: Vec<bool> = roles.iter().map(|r| PINNED_ROLES.contains(r)).collect();
        let mut starts: Vec<bool> = roles.iter().map(|r| *r == "user").collect();
        // A tool answer and the call it answers share one turn.
        for (t, m) in messages.iter().enumerate() {
            if roles.get(t) != Some(&"tool") {
                continue;
            }
            let Some(caller) = caller_of(messages, t, m) else {
                continue;
            };
            for s in starts.iter_mut().take(t + 1).skip(caller + 1) {
                *s = false;
            }
        }
        Some(Turns {
            starts,
            pinned,
            current: last_user,
        })
    }

    fn prompt<'a>(&self, body: &'a Json) -> Option<Prompt<'a>> {
        Some(Prompt::new(None, None, body.get("messages")))
    }

    fn prompt_fields(&self) -> &'static [&'static str] {
        &["messages", "prompt", "suffix"]
    }

    fn question(&self) -> Option<Question> {
        Some(Question::LastUserMessage)
    }

    fn converses(&self) -> bool {
        true
    }

    fn takes_prompt_cache_key(&self) -> bool {
        true
    }

    /// Tools (or legacy functions), the leading system and developer
    /// messages, and the first user message.
    fn prefix<'a>(&self, body: &'a Json) -> Option<Prefix<'a>> {
        let messages = items(body.get("messages"));
        let system = messages
            .iter()
            .take_while(|m| matches!(role(m), Some("system" | "developer")))
            .count();
        Some(Prefix {
            shared: [
                Some(one(body.get("tools").or(body.get("functions")))),
                Some(messages.get(..system).unwrap_or_default()),
            ],
            turn: one(messages.iter().find(|m| role(m) == Some("user"))),
        })
    }

    fn ask_for_usage(&self, doc: &mut Document) -> bool {
        ask_for_usage(doc)
    }
}

/// The value of `stream_options` that asks the provider for usage.
const ASK_USAGE: &[u8] = br#"{"include_usage":true}"#;

/// Sets `stream_options.include_usage` in the body of a streamed request,
/// every other byte kept (the final chunk then carries `usage`, which the
/// stream's grammar picks up). False, and nothing changed, when it needs no
/// change (not a stream, or usage already asked) or cannot take one without
/// rewriting what the client wrote (a `stream_options` of its own).
pub(crate) fn ask_for_usage(doc: &mut Document) -> bool {
    let Some(tree) = doc.tree() else {
        return false;
    };
    if tree.get("stream") != Some(&Json::Bool(true)) || tree.get("stream_options").is_some() {
        return false;
    }
    doc.set_text("stream_options", ASK_USAGE)
}

/// The index of the assistant message before `t` whose `tool_calls` hold the
/// id the tool message `m` answers; without an id, the nearest assistant
/// message that calls tools.
fn caller_of(messages: &[Json], t: usize, m: &Json) -> Option<usize> {
    let id = match m.get("tool_call_id") {
        Some(Json::String(id)) => Some(id.as_str()),
        _ => None,
    };
    messages.get(..t)?.iter().rposition(|a| {
        let Some(Json::Array(calls)) = a.get("tool_calls") else {
            return false;
        };
        match id {
            Some(id) => calls
                .iter()
                .any(|c| matches!(c.get("id"), Some(Json::String(x)) if x == id)),
            None => !calls.is_empty(),
        }
    })
}

// The answer: OpenAI's family's (the [`super::answer`] side), each choice a
// `message`, streamed as `delta`s.

use super::answer::{Choices, Stored};
use super::openai::Family;
use super::Dialect;

impl Family for Chat {
    const DIALECT: Dialect = Dialect::Chat;
    const STORED: Stored = Stored::Canonical(Some(Choices {
        object: "chat.completion",
        chunk: "chat.completion.chunk",
        message: true,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

//! OpenAI chat completions (`…/chat/completions`), in its own words.

/// OpenAI chat completions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Chat;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

use super::request::{
    items, one, only_role, role, Prefix, Prompt, Question, Request, Turns, PINNED_ROLES,
};
use crate::json::{Document, Json};
use crate::shaping::TokenField;

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
        crate::usage::ask_for_usage(doc)
    }
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

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

//! Anthropic Messages (`…/messages`), in its own words.

/// Anthropic Messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

use super::request::{
    items, non_empty_string, one, only_role, role, Prefix, Prompt, RateHeaders, Request, Turns,
};
use crate::json::Json;
use crate::shaping::TokenField;

impl Request for Messages {
    fn provider(&self) -> &'static str {
        "anthropic"
    }

    /// Anthropic's `metadata.user_id`.
    fn user<'a>(&self, body: &'a Json) -> Option<&'a str> {
        non_empty_string(body.get("metadata")?.get("user_id")?)
    }

    /// Anthropic's `x-api-key`, else `authorization`.
    fn authenticates_with(&self) -> &'static [&'static str] {
        &["x-api-key", "authorization"]
    }

    fn credential_header(&self) -> Option<&'static str> {
        Some("x-api-key")
    }

    fn samples(&self) -> bool {
        true
    }

    /// Anthropic's `anthropic-ratelimit-*`, the reset an instant.
    fn rate_headers(&self) -> &'static RateHeaders {
        &RATE_HEADERS
    }

    fn output_cap_field(&self, _configured: TokenField) -> Option<TokenField> {
        Some(TokenField::MaxTokens)
    }

    fn shaped(&self) -> bool {
        true
    }

    fn turns_field(&self) -> Option<&'static str> {
        Some("messages")
    }

    /// A user message starts a turn unless it answers a tool call (a
    /// `tool_result` block); nothing is pinned (the system prompt is apart).
    fn turns(&self, messages: &[Json]) -> Option<Turns> {
        let roles = messages
            .iter()
            .map(only_role)
            .collect::<Option<Vec<&str>>>()?;
        let starts: Vec<bool> = messages
            .iter()
            .zip(&roles)
            .map(|(m, r)| *r == "user" && !answers_a_tool(m))
            .collect();
        let current = starts.iter().rposition(|s| *s)?;
        Some(Turns {
            pinned: vec![false; messages.len()],
            starts,
            current,
        })
    }

    fn prompt<'a>(&self, body: &'a Json) -> Option<Prompt<'a>> {
        Some(Prompt::new(body.get("system"), None, body.get("messages")))
    }

    fn prompt_fields(&self) -> &'static [&'static str] {
        &["system", "messages"]
    }

    fn converses(&self) -> bool {
        true
    }

    /// Tools then the system prompt, cut after the first block a
    /// `cache_control` marks when one does (what the provider caches: the
    /// mark ends the shared part), and the first user message.
    fn prefix<'a>(&self, body: &'a Json) -> Option<Prefix<'a>> {
        let mut shared = [None, None];
        for (slot, part) in shared
            .iter_mut()
            .zip([body.get("tools"), body.get("system")])
        {
            let Some(Json::Array(blocks)) = part else {
                *slot = Some(one(part));
                continue;
            };
            let mark = blocks.iter().position(|b| b.get("cache_control").is_some());
            let cut = mark.map_or(blocks.len(), |i| i.saturating_add(1));
            *slot = Some(blocks.get(..cut).unwrap_or(blocks));
            if mark.is_some() {
                break;
            }
        }
        Some(Prefix {
            shared,
            turn: one(items(body.get("messages"))
                .iter()
                .find(|m| role(m) == Some("user"))),
        })
    }
}

/// Anthropic's rate-limit headers.
const RATE_HEADERS: RateHeaders = RateHeaders {
    requests: [
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
    ],
    tokens: [
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    ],
    reset_at: true,
};

/// True when an Anthropic message's content holds a `tool_result` block.
fn answers_a_tool(message: &Json) -> bool {
    matches!(message.get("content"), Some(Json::Array(blocks))
        if blocks.iter().any(|b| matches!(b.get("type"), Some(Json::String(t)) if t == "tool_result")))
}

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

//! Which messages of a conversation to send. System and developer messages
//! and the current turn (the last user message and everything after it) are
//! always kept; older turns are kept newest first while they fit both the
//! turn count and the prompt-token estimate, and the first that does not fit
//! ends the history, so what is sent is always the most recent whole turns.
//!
//! A turn starts at a user message and runs to the next one. An assistant
//! message that calls tools and the `tool` messages answering it stay in one
//! turn even when a user message sits between them, so they are kept or left
//! out together; no message is ever cut.
//!
//! The other dialects split their conversations the same way, each by its
//! own shape: Anthropic's `messages` (no system message among them: the
//! system prompt is apart) where a user message carrying a `tool_result`
//! answers the `tool_use` before it and so continues its turn; OpenAI
//! Responses' `input` items, where a user message starts a turn, system and
//! developer messages are always kept, and function calls, their outputs and
//! reasoning items belong to the turn they sit in.

use crate::dialect::Dialect;
use crate::json::Json;
use crate::routing::rules::message_tokens;

/// Roles that are always kept, wherever they stand.
const PINNED_ROLES: [&str; 2] = ["system", "developer"];

/// Which `messages` of a chat call to keep (same length, in order); `None`
/// when every message is kept or the list is not understood (a message that
/// is not an object with one string `role`, or no user message at all).
pub fn keep_history(
    messages: &[Json],
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> Option<Vec<bool>> {
    keep_turns(Dialect::Chat, messages, max_turns, max_prompt_tokens)
}

/// Which items of the conversation of a call of `endpoint` to keep: chat's
/// and Anthropic's `messages`, Responses' `input` items; `None` as for
/// [`keep_history`], and for a dialect without a conversation to trim.
pub fn keep_turns(
    endpoint: Dialect,
    messages: &[Json],
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> Option<Vec<bool>> {
    let turns = match endpoint {
        Dialect::Chat => chat_turns(messages)?,
        Dialect::Messages => anthropic_turns(messages)?,
        Dialect::Responses => input_turns(messages)?,
        _ => return None,
    };
    keep(&turns, messages, max_turns, max_prompt_tokens)
}

/// How a conversation splits into turns: where one starts, what is always
/// kept, and the message the current turn is anchored on.
struct Turns {
    starts: Vec<bool>,
    pinned: Vec<bool>,
    current: usize,
}

/// Chat: turns start at user messages, tool answers join their call's turn.
fn chat_turns(messages: &[Json]) -> Option<Turns> {
    let roles = messages.iter().map(role).collect::<Option<Vec<&str>>>()?;
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

/// Anthropic Messages: a user message starts a turn unless it answers a
/// tool call (a `tool_result` block); nothing is pinned.
fn anthropic_turns(messages: &[Json]) -> Option<Turns> {
    let roles = messages.iter().map(role).collect::<Option<Vec<&str>>>()?;
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

/// True when an Anthropic message's content holds a `tool_result` block.
fn answers_a_tool(message: &Json) -> bool {
    matches!(message.get("content"), Some(Json::Array(blocks))
        if blocks.iter().any(|b| matches!(b.get("type"), Some(Json::String(t)) if t == "tool_result")))
}

/// Responses `input` items: a user message starts a turn; system and
/// developer messages are pinned; every other item (an assistant message, a
/// function call and its output, reasoning) belongs to the turn it sits in.
fn input_turns(items: &[Json]) -> Option<Turns> {
    let mut starts = Vec::with_capacity(items.len());
    let mut pinned = Vec::with_capacity(items.len());
    for item in items {
        if !matches!(item, Json::Object(_)) {
            return None;
        }
        let r = match item.members("role").count() {
            0 => None,
            1 => Some(role(item)?),
            _ => return None,
        };
        starts.push(r == Some("user"));
        pinned.push(r.is_some_and(|r| PINNED_ROLES.contains(&r)));
    }
    let current = starts.iter().rposition(|s| *s)?;
    Some(Turns {
        starts,
        pinned,
        current,
    })
}

/// Which messages to keep under the limits, once split into turns.
fn keep(
    turns: &Turns,
    messages: &[Json],
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> Option<Vec<bool>> {
    let Turns {
        starts,
        pinned,
        current: anchor,
    } = turns;
    // Turn number of every message that is not pinned, counted from the start.
    let mut turn_of: Vec<Option<usize>> = vec![None; messages.len()];
    let mut turns = 0usize;
    for i in 0..messages.len() {
        if pinned.get(i).copied().unwrap_or(true) {
            continue;
        }
        if turns == 0 || starts.get(i).copied().unwrap_or(false) {
            turns += 1;
        }
        if let Some(slot) = turn_of.get_mut(i) {
            *slot = Some(turns);
        }
    }
    let current = turn_of.get(*anchor).copied().flatten()?;
    let tokens: Vec<u64> = messages.iter().map(message_tokens).collect();
    // Tokens of what is always sent, then of each older turn.
    let mut per_turn = vec![0u64; current];
    let mut used = 0u64;
    for (i, t) in turn_of.iter().enumerate() {
        let n = tokens.get(i).copied().unwrap_or(0);
        match t {
            Some(t) if *t < current => {
                if let Some(slot) = per_turn.get_mut(*t) {
                    *slot = slot.saturating_add(n);
                }
            }
            _ => used = used.saturating_add(n),
        }
    }
    let turn_budget = max_turns.map_or(u64::MAX, |m| m.saturating_sub(1));
    let mut oldest_kept = current;
    for (kept_turns, t) in (1..current).rev().enumerate() {
        let n = per_turn.get(t).copied().unwrap_or(0);
        let fits_tokens = max_prompt_tokens.is_none_or(|max| used.saturating_add(n) <= max);
        if kept_turns as u64 >= turn_budget || !fits_tokens {
            break;
        }
        used = used.saturating_add(n);
        oldest_kept = t;
    }
    if oldest_kept == 1 {
        return None;
    }
    Some(
        turn_of
            .iter()
            .map(|t| t.is_none_or(|t| t >= oldest_kept))
            .collect(),
    )
}

/// The message's one string `role`.
fn role(message: &Json) -> Option<&str> {
    if !matches!(message, Json::Object(_)) {
        return None;
    }
    let mut roles = message.members("role");
    let role = match roles.next()? {
        Json::String(r) => r.as_str(),
        _ => return None,
    };
    roles.next().is_none().then_some(role)
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

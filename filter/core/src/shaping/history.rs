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
//! own shape (its dialect says how, [`crate::dialect::request::Request::turns`]): Anthropic's `messages` (no system message among them: the
//! system prompt is apart) where a user message carrying a `tool_result`
//! answers the `tool_use` before it and so continues its turn; OpenAI
//! Responses' `input` items, where a user message starts a turn, system and
//! developer messages are always kept, and function calls, their outputs and
//! reasoning items belong to the turn they sit in; Gemini's `contents`, where
//! a user content starts a turn unless it answers the model's function call.

use crate::dialect::request::Turns;
use crate::dialect::Dialect;
use crate::json::Json;

/// Which items of the conversation of a call of `dialect` to keep (same
/// length, in order): chat's and Anthropic's `messages`, Responses' `input`
/// items; `None` when every item is kept or the list is not understood (a
/// message that is not an object with one string `role`, or no user message
/// at all), and for a dialect without a conversation to trim.
pub fn keep_turns(
    dialect: Dialect,
    messages: &[Json],
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> Option<Vec<bool>> {
    let api = dialect.request();
    let turns = api.turns(messages)?;
    let tokens: Vec<u64> = messages.iter().map(|m| api.turn_tokens(m)).collect();
    keep(&turns, &tokens, max_turns, max_prompt_tokens)
}

/// Which messages to keep under the limits, once split into turns and
/// weighed (`tokens`, one per message).
fn keep(
    turns: &Turns,
    tokens: &[u64],
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> Option<Vec<bool>> {
    let Turns {
        starts,
        pinned,
        current: anchor,
    } = turns;
    // Turn number of every message that is not pinned, counted from the start.
    let mut turn_of: Vec<Option<usize>> = vec![None; tokens.len()];
    let mut turns = 0usize;
    for i in 0..tokens.len() {
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

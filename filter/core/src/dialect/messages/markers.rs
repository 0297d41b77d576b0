//! Anthropic's prompt-cache breakpoints, put on a Messages call that carries
//! none. The provider caches the prefix a `cache_control` block ends (tools,
//! then the system prompt, then the messages), at most four per request, and
//! looks for an earlier entry at most 20 blocks back from each. So the
//! filter marks, in that order and each only when the prefix it ends is long
//! enough to be cached:
//!
//! ```text
//! tools[last]                 the definitions, the same on every call
//! system[last block]          the instructions (a string becomes one text block)
//! the previous user message   where the call before this one ended: read back
//! the last message            where the next call will read from
//! ```
//!
//! The last message is marked only once the call continues a conversation
//! (an assistant message comes before it): a one-shot question would pay
//! the write's premium for a prefix nobody asks again. A client that placed
//! any marker of its own (on a block, a nested block, a tool, or the
//! request's top-level automatic `cache_control`) knows its prompt better: nothing is moved or
//! added. Every edit is an insertion into the bytes as received (a string
//! content's bytes are kept inside the block that replaces it); nothing is
//! parsed again but the (at most two) messages marked, and the tree, which
//! nothing reads after this last edit, is dropped.

use std::ops::Range;

use crate::dialect::features::{message_tokens, text_tokens};
use crate::dialect::request::MarkAsk;
use crate::json::{Document, Json};
use crate::tokens;

/// One marker: in top-level member `member`, the bytes it goes at (an
/// object's, or a string's to wrap in a text block), relative to the
/// member's value.
struct Edit {
    member: &'static str,
    at: Range<usize>,
    wrap: bool,
}

/// Marks `doc` as `ask` says; the markers placed (at most four: one per
/// member but the messages, which take two).
pub(super) fn mark(doc: &mut Document, ask: &MarkAsk) -> u32 {
    let edits = match doc.tree() {
        Some(tree) if !client_marked(tree) => plan(doc, tree, ask),
        _ => return 0,
    };
    let marker: &[u8] = if ask.hour {
        br#"{"type":"ephemeral","ttl":"1h"}"#
    } else {
        br#"{"type":"ephemeral"}"#
    };
    let mut placed = 0;
    // Planned member by member, in the order of each one's bytes.
    for mine in edits.chunk_by(|a, b| a.member == b.member) {
        let Some(name) = mine.first().map(|e| e.member) else {
            continue;
        };
        let value = doc.value_range(name).and_then(|r| doc.bytes().get(r));
        let Some(bytes) = value.and_then(|v| spliced(v, mine, marker)) else {
            continue;
        };
        // The tree no longer says what the bytes say: nothing reads it
        // after this last edit, and it is dropped below.
        if doc.set(name, &bytes, Json::Null) {
            placed += mine.len() as u32;
        }
    }
    if placed > 0 {
        doc.drop_tree();
    }
    placed
}

/// Where the markers go in a body of `tree` (see the module's table).
fn plan(doc: &Document, tree: &Json, ask: &MarkAsk) -> Vec<Edit> {
    let mut edits = Vec::new();
    let long = |milli: u64| tokens::tokens(milli) >= ask.min_tokens;
    let start = |name| doc.value_range(name).map_or(0, |r| r.start);
    let relative =
        |r: &Range<usize>, base: usize| r.start.saturating_sub(base)..r.end.saturating_sub(base);
    // The tools: their definitions' text, as sent.
    let mut milli = 0u64;
    let tools = doc.item_ranges("tools").unwrap_or_default();
    for r in tools {
        let text = doc
            .bytes()
            .get(r.clone())
            .and_then(|b| std::str::from_utf8(b).ok());
        milli = milli.saturating_add(text.map_or(0, tokens::milli_tokens));
    }
    if let (Some(last), true) = (tools.last(), long(milli)) {
        edits.push(Edit {
            member: "tools",
            at: relative(last, start("tools")),
            wrap: false,
        });
    }
    // The system prompt: its last block, or its string.
    if let Some(system) = tree.get("system") {
        milli = milli.saturating_add(text_tokens(system).saturating_mul(1000));
        let base = start("system");
        let at = match system {
            Json::String(s) if !s.is_empty() => doc.value_range("system").map(|r| (r, true)),
            Json::Array(blocks) => markable(blocks)
                .and_then(|b| Some((doc.item_ranges("system")?.get(b)?.clone(), false))),
            _ => None,
        };
        if let (Some((at, wrap)), true) = (at, long(milli)) {
            edits.push(Edit {
                member: "system",
                at: relative(&at, base),
                wrap,
            });
        }
    }
    // The previous user message, and the last one once a conversation.
    let (Some(Json::Array(messages)), Some(ranges)) =
        (tree.get("messages"), doc.item_ranges("messages"))
    else {
        return edits;
    };
    let last = messages.len().saturating_sub(1);
    let user = |m: &&Json| matches!(m.get("role"), Some(Json::String(r)) if r == "user");
    let previous = messages.iter().take(last).rposition(|m| user(&m));
    let continues = messages
        .iter()
        .take(last)
        .any(|m| matches!(m.get("role"), Some(Json::String(r)) if r == "assistant"));
    let base = start("messages");
    for (i, m) in messages.iter().enumerate() {
        milli = milli.saturating_add(message_tokens(m).saturating_mul(1000));
        if (Some(i) == previous || (i == last && continues)) && long(milli) {
            if let Some(mut e) = ranges.get(i).and_then(|r| message_edit(doc, r)) {
                e.at = relative(&e.at, base);
                edits.push(e);
            }
        }
    }
    edits
}

/// The client placed a marker of its own somewhere: on the request (its
/// automatic caching), a tool, a system block, a message's block, or a
/// block nested in one (a tool result's).
fn client_marked(v: &Json) -> bool {
    match v {
        Json::Array(items) => items.iter().any(client_marked),
        Json::Object(members) => members
            .iter()
            .any(|(k, v)| k == "cache_control" || client_marked(v)),
        _ => false,
    }
}

/// The block a marker may end on, the last of `blocks` that can carry one:
/// no thinking (Anthropic refuses a marker there) and no empty text.
fn markable(blocks: &[Json]) -> Option<usize> {
    blocks.iter().rposition(|b| match b.get("type") {
        Some(Json::String(t)) => match t.as_str() {
            "thinking" | "redacted_thinking" => false,
            "text" => !matches!(b.get("text"), Some(Json::String(t)) if t.is_empty()),
            _ => true,
        },
        _ => false,
    })
}

/// The marker of the message whose bytes are at `at`: on its last block
/// that can carry one, or around its text (in the body's coordinates).
fn message_edit(doc: &Document, at: &Range<usize>) -> Option<Edit> {
    let (message, spans) = Json::parse_with_spans(doc.bytes().get(at.clone())?)?;
    let span = spans.iter().rfind(|s| s.name == "content")?;
    let (r, wrap) = match message.get("content")? {
        Json::String(s) if !s.is_empty() => (&span.value, true),
        Json::Array(blocks) => (span.items.as_ref()?.get(markable(blocks)?)?, false),
        _ => return None,
    };
    Some(Edit {
        member: "messages",
        at: r.start.saturating_add(at.start)..r.end.saturating_add(at.start),
        wrap,
    })
}

/// The member's `value` with `edits` (in the order of their bytes) in:
/// each object gets the marker before its closing brace, each string is
/// wrapped in a text block. `None` when an edit is not where it should be.
fn spliced(value: &[u8], edits: &[Edit], marker: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(value.len().saturating_add(128));
    let mut from = 0;
    for e in edits {
        let inner = value.get(e.at.clone())?;
        let (keep, end) = if e.wrap {
            (e.at.start, e.at.end)
        } else {
            (e.at.end.checked_sub(1)?, e.at.end)
        };
        out.extend_from_slice(value.get(from..keep)?);
        if e.wrap {
            out.extend_from_slice(br#"[{"type":"text","text":"#);
            out.extend_from_slice(inner);
            out.push(b',');
        } else if inner.last() != Some(&b'}') {
            return None;
        } else if inner
            .iter()
            .skip(1)
            .any(|b| !b.is_ascii_whitespace() && *b != b'}')
        {
            out.push(b',');
        }
        out.extend_from_slice(br#""cache_control":"#);
        out.extend_from_slice(marker);
        out.extend_from_slice(if e.wrap { b"}]" } else { b"}" });
        from = end;
    }
    out.extend_from_slice(value.get(from..)?);
    Some(out)
}

#[cfg(test)]
mod tests;

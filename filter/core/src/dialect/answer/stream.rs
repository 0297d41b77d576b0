//! The event grammars of the dialects' streams, each read as it passes by
//! the generic reader of [`crate::sse`], and [`AnyGrammar`], the one a call's
//! dialect picks, held without a box. OpenAI's chat and text completions
//! stream `data:` JSON chunks only, ending with `data: [DONE]`. The OpenAI
//! Responses and Anthropic Messages streams name each event (`event:
//! message_delta` before its `data: {json}`) and have no `[DONE]`: their
//! grammars read the event's name, add up the usage across events
//! (Anthropic reports the input tokens in `message_start` and the output
//! tokens in `message_delta`), end at the final event (`response.completed`,
//! `message_stop`), and ask no strip (their usage always comes). Events they
//! do not know pass as they came. Google Gemini streams whole responses, no
//! terminator. A dialect gives its own ([`super::Answer::grammar`]).

pub mod chat;
pub mod gemini;
pub mod messages;
pub mod responses;

use serde_json::Value;

pub use chat::Chat;
pub use gemini::Gemini;
pub use messages::Messages;
pub use responses::Responses;

use crate::sse::reader::Event;
use crate::sse::{tree_of, FinishReasons, Grammar, Parsed, Reading, Transcript};
use crate::usage::Usage;

/// The grammar of a call's dialect.
#[derive(Debug)]
pub enum AnyGrammar {
    /// OpenAI chat and text completions.
    Chat(Chat),
    /// OpenAI Responses.
    Responses(Responses),
    /// Anthropic Messages.
    Messages(Messages),
    /// Google Gemini.
    Gemini(Gemini),
}

impl Default for AnyGrammar {
    fn default() -> Self {
        Self::Chat(Chat::default())
    }
}

impl AnyGrammar {
    fn grammar(&mut self) -> &mut dyn Grammar {
        match self {
            Self::Chat(g) => g,
            Self::Responses(g) => g,
            Self::Messages(g) => g,
            Self::Gemini(g) => g,
        }
    }

    fn grammar_ref(&self) -> &dyn Grammar {
        match self {
            Self::Chat(g) => g,
            Self::Responses(g) => g,
            Self::Messages(g) => g,
            Self::Gemini(g) => g,
        }
    }
}

impl Grammar for AnyGrammar {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        self.grammar().read(event, parse)
    }

    fn usage(&self) -> Option<Usage> {
        self.grammar_ref().usage()
    }

    fn ended(&self) -> bool {
        self.grammar_ref().ended()
    }

    fn finished(&self) -> bool {
        self.grammar_ref().finished()
    }

    fn finish_reasons(&self) -> &FinishReasons {
        self.grammar_ref().finish_reasons()
    }

    fn keep_text(&mut self, limit: usize) {
        self.grammar().keep_text(limit);
    }

    fn transcript(&self) -> Option<&Transcript> {
        self.grammar_ref().transcript()
    }

    fn response_id(&self) -> Option<&str> {
        self.grammar_ref().response_id()
    }
}

/// The tree of an event a grammar reads: the one parsed for a collector,
/// else its data parsed now; `None` when it is not JSON.
fn read_tree<'a>(
    tree: &'a Option<Option<Value>>,
    data: &[u8],
) -> Option<std::borrow::Cow<'a, Value>> {
    match tree {
        Some(Some(t)) => Some(std::borrow::Cow::Borrowed(t)),
        Some(None) => None,
        None => serde_json::from_slice::<Value>(data)
            .ok()
            .map(std::borrow::Cow::Owned),
    }
}

/// Reads one event of a stream that names its events (Responses,
/// Messages): its data is parsed only when a collector takes it or `reads`
/// says the grammar wants it by its name (`None`: unnamed, read for its
/// `type`), and then handed to `note` with the name.
fn read_named(
    event: &Event<'_>,
    parse: bool,
    reads: impl Fn(&[u8]) -> bool,
    mut note: impl FnMut(Option<&[u8]>, &Value),
) -> Reading {
    let Some(data) = event.data else {
        return Reading::default();
    };
    let tree = tree_of(data, parse);
    let named = responses::kind(event, tree.as_ref().and_then(Option::as_ref));
    if named.is_none_or(&reads) {
        if let Some(t) = read_tree(&tree, data).as_deref() {
            note(named, t);
        }
    }
    Reading {
        usage_only: false,
        parsed: Parsed::of(tree),
    }
}

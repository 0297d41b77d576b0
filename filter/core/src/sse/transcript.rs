//! The text of a streamed answer, kept as the stream's one reading passes
//! it when `tracing.capture.completion` asks: each choice's text deltas
//! joined, within a bound of bytes for all of them, so a long stream holds
//! no more than the capture will keep. A choice whose text went on past the
//! bound says so: its last word may be the head of a secret that no rule
//! knows until it is whole, and the capture leaves it out.

/// Most choices whose text is kept.
pub const MAX_CHOICES: usize = 8;

/// The text of a stream's choices so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transcript {
    limit: usize,
    held: usize,
    choices: Vec<Choice>,
    /// Text did not fit.
    pub cut: bool,
}

/// One choice's text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Choice {
    index: u64,
    text: String,
    /// Text after `text` did not fit: its last word may be cut.
    lost: bool,
}

impl Transcript {
    /// A transcript keeping at most `limit` bytes of text.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Adds `text` to choice `index`, within the bound (cut on a character
    /// boundary; the capture cuts again at a word's end).
    pub fn push(&mut self, index: u64, text: &str) {
        if text.is_empty() {
            return;
        }
        let room = self.limit.saturating_sub(self.held);
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.cut |= end < text.len();
        let at = match self.choices.iter().position(|c| c.index == index) {
            Some(at) => at,
            None if end > 0 && self.choices.len() < MAX_CHOICES => {
                self.choices.push(Choice {
                    index,
                    ..Choice::default()
                });
                self.choices.len() - 1
            }
            None => {
                self.cut = true;
                return;
            }
        };
        if let Some(c) = self.choices.get_mut(at) {
            c.lost |= end < text.len();
            c.text.push_str(text.get(..end).unwrap_or_default());
            self.held += end;
        }
    }

    /// The text of each choice, in the order they first spoke.
    pub fn texts(&self) -> Vec<&str> {
        self.choices.iter().map(|c| c.text.as_str()).collect()
    }

    /// The text of each choice, and whether text after it was left out.
    pub fn kept(&self) -> impl Iterator<Item = (&str, bool)> {
        self.choices.iter().map(|c| (c.text.as_str(), c.lost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_joined_per_choice_within_the_bound() {
        let mut t = Transcript::new(8);
        t.push(0, "Hel");
        t.push(1, "ab");
        t.push(0, "lo");
        assert_eq!(t.texts(), ["Hello", "ab"]);
        assert!(!t.cut);
        // One byte left: `é` takes two.
        t.push(0, "xé");
        t.push(0, "é");
        assert_eq!(t.texts(), ["Hellox", "ab"]);
        assert!(t.cut);
        let mut many = Transcript::new(100);
        for i in 0..10 {
            many.push(i, "a");
        }
        assert_eq!(many.texts().len(), MAX_CHOICES);
    }

    #[test]
    fn a_choice_whose_text_went_past_the_bound_says_so() {
        let mut t = Transcript::new(13);
        t.push(0, "ab ");
        t.push(1, "done");
        t.push(0, "sk-abc");
        assert_eq!(
            t.kept().collect::<Vec<_>>(),
            [("ab sk-abc", false), ("done", false)]
        );
        // Choice 0 goes on past the bound; choice 1 speaks after it; a
        // choice first heard after it is left out.
        t.push(0, "defgh");
        t.push(1, "x");
        t.push(2, "late");
        assert_eq!(
            t.kept().collect::<Vec<_>>(),
            [("ab sk-abc", true), ("done", true)]
        );
        assert!(t.cut);
    }

    #[test]
    fn each_dialects_stream_keeps_its_text_when_asked() {
        use crate::sse::{Grammar, Stream};
        let messages = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":2}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"there\"}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let responses = concat!(
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi there\"}]}],\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n\n",
        );
        let chat = "data: {\"choices\":[{\"index\":0,\"text\":\"Hi \"}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":[1],\"text\":\"there\"}],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n";
        for (dialect, body) in [
            (crate::dialect::Dialect::Messages, messages),
            (crate::dialect::Dialect::Responses, responses),
            (crate::dialect::Dialect::Completions, chat),
        ] {
            let mut kept = Stream::with_grammar(dialect.answer().grammar());
            kept.keep_text(100);
            kept.feed(body.as_bytes(), true, None);
            let t = kept.grammar().transcript().expect("kept");
            assert_eq!(t.texts(), ["Hi there"], "{dialect:?}");
            assert!(kept.usage().is_some(), "{dialect:?}: the usage as before");
            let mut plain = Stream::with_grammar(dialect.answer().grammar());
            plain.feed(body.as_bytes(), true, None);
            assert!(plain.grammar().transcript().is_none());
            assert_eq!(plain.usage(), kept.usage());
        }
    }
}

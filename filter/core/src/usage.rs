//! Token usage and what else a JSON answer says of itself, in words of no
//! dialect: the types the concerns (limits, spans, learning, the cache)
//! read. Where each API writes them is its dialect's
//! (the dialect's answer reader: `Answer::usage`, `Answer::head`).

/// Tokens of one call, whatever dialect reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens, those read from the provider's prompt cache included.
    pub prompt_tokens: u64,
    /// Output tokens (absent for embeddings).
    pub completion_tokens: u64,
    /// Input tokens the provider read from its prompt cache.
    pub cached_tokens: u64,
    /// Input tokens the provider wrote to its prompt cache (Anthropic's
    /// `cache_creation_input_tokens`), priced apart from the rest.
    pub cache_write_tokens: u64,
    /// Of those, the ones written to be kept an hour rather than five
    /// minutes (Anthropic's `cache_creation.ephemeral_1h_input_tokens`).
    pub cache_write_1h_tokens: u64,
    /// Output tokens the model spent reasoning (OpenAI's `reasoning_tokens`,
    /// Gemini's `thoughtsTokenCount`), a part of `completion_tokens`.
    pub reasoning_tokens: u64,
}

impl Usage {
    /// This usage with the fields `later` reports in place of its own: a
    /// stream that reports its usage over several events (Anthropic's input
    /// in `message_start`, its output in `message_delta`) adds up to one.
    pub fn updated_by(self, later: Usage) -> Usage {
        let pick = |a: u64, b: u64| if b > 0 { b } else { a };
        Usage {
            prompt_tokens: pick(self.prompt_tokens, later.prompt_tokens),
            completion_tokens: pick(self.completion_tokens, later.completion_tokens),
            cached_tokens: pick(self.cached_tokens, later.cached_tokens),
            cache_write_tokens: pick(self.cache_write_tokens, later.cache_write_tokens),
            cache_write_1h_tokens: pick(self.cache_write_1h_tokens, later.cache_write_1h_tokens),
            reasoning_tokens: pick(self.reasoning_tokens, later.reasoning_tokens),
        }
    }
}

/// Most finish reasons kept of one answer.
pub const MAX_FINISH_REASONS: usize = 8;

/// What the filter reads of a whole JSON answer, as its dialect read it:
/// its usage, its id, the model that answered and why it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    /// The tokens the answer reports.
    pub usage: Option<Usage>,
    /// The answer's id (a Responses response's is the one a later call
    /// continues).
    pub id: Option<String>,
    /// The model that answered, as the answer names it.
    pub model: Option<String>,
    /// Why it ended, in the order the answer says (at most
    /// [`MAX_FINISH_REASONS`]).
    reasons: Vec<String>,
}

impl Head {
    /// A head of this usage, id and model, with no finish reason yet.
    pub fn new(usage: Option<Usage>, id: Option<String>, model: Option<String>) -> Self {
        Self {
            usage,
            id,
            model,
            reasons: Vec::new(),
        }
    }

    /// Takes one more reason the answer ended; past [`MAX_FINISH_REASONS`]
    /// it is left out.
    pub fn ended_for(&mut self, reason: &str) {
        if self.reasons.len() < MAX_FINISH_REASONS {
            self.reasons.push(reason.to_string());
        }
    }

    /// Why the answer ended (at most [`MAX_FINISH_REASONS`]).
    pub fn finish_reasons(&self) -> Vec<&str> {
        self.reasons.iter().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streams_usage_over_two_events_adds_up() {
        let want = |p, c, cached| Usage {
            prompt_tokens: p,
            completion_tokens: c,
            cached_tokens: cached,
            ..Usage::default()
        };
        assert_eq!(want(10, 1, 7).updated_by(want(0, 42, 0)), want(10, 42, 7));
        assert_eq!(want(10, 1, 7).updated_by(Usage::default()), want(10, 1, 7));
    }

    #[test]
    fn a_head_keeps_a_bounded_number_of_reasons() {
        let mut head = Head::new(None, None, None);
        for _ in 0..20 {
            head.ended_for("stop");
        }
        assert_eq!(head.finish_reasons().len(), MAX_FINISH_REASONS);
    }
}

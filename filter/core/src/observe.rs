//! What one LLM call looked like from the proxy (status, timings, tokens),
//! turned into the filter's request metrics when the call ends.

use crate::host::Metrics;
use crate::metrics;
use crate::priority::Priority;
use crate::usage::Usage;

/// How a call ended, as the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx (or 1xx/3xx: the call was answered).
    Success,
    /// 429 from upstream or a local shed.
    RateLimited,
    /// Other 4xx.
    ClientError,
    /// 5xx.
    ServerError,
    /// No response status at all: reset or disconnect.
    Reset,
    /// The filter refused the call itself (shed, circuit open, budget spent).
    Refused,
}

impl Outcome {
    /// The outcome of a response status (`None`: no response).
    pub fn of(status: Option<u16>) -> Self {
        match status {
            None => Self::Reset,
            Some(429) => Self::RateLimited,
            Some(400..=499) => Self::ClientError,
            Some(500..=599) => Self::ServerError,
            Some(_) => Self::Success,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::RateLimited => "rate_limited",
            Self::ClientError => "client_error",
            Self::ServerError => "server_error",
            Self::Reset => "reset",
            Self::Refused => "refused",
        }
    }
}

/// A finished call.
#[derive(Debug, Clone, Default)]
pub struct CallRecord<'a> {
    /// The call's priority.
    pub priority: Priority,
    /// The model label (already bounded).
    pub model: &'a str,
    /// Response status, `None` if none arrived.
    pub status: Option<u16>,
    /// When the request headers arrived, ms.
    pub started_ms: u64,
    /// When the first response body byte passed, ms.
    pub first_byte_ms: Option<u64>,
    /// When the call ended, ms.
    pub ended_ms: u64,
    /// Tokens the provider reported.
    pub usage: Option<Usage>,
    /// The filter refused the call with a local error reply.
    pub refused: bool,
}

impl CallRecord<'_> {
    /// Emits the request metrics of this call.
    pub fn emit(&self, m: &mut dyn Metrics) {
        let outcome = if self.refused {
            Outcome::Refused
        } else {
            Outcome::of(self.status)
        };
        m.counter(
            &metrics::name(
                metrics::REQUESTS,
                &[
                    ("priority", self.priority.as_str()),
                    ("model", self.model),
                    ("outcome", outcome.as_str()),
                ],
            ),
            1,
        );
        let model = [("model", self.model)];
        m.histogram(
            &metrics::name(metrics::OPERATION_DURATION, &model),
            self.ended_ms.saturating_sub(self.started_ms),
        );
        if let Some(first) = self.first_byte_ms {
            m.histogram(
                &metrics::name(metrics::TIME_TO_FIRST_TOKEN, &model),
                first.saturating_sub(self.started_ms),
            );
        }
        if let Some(u) = self.usage {
            for (kind, n) in [("input", u.prompt_tokens), ("output", u.completion_tokens)] {
                if n > 0 {
                    m.counter(
                        &metrics::name(
                            metrics::TOKEN_USAGE,
                            &[("model", self.model), ("token_type", kind)],
                        ),
                        n,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryMetrics;

    #[test]
    fn outcome_by_status() {
        assert_eq!(Outcome::of(None), Outcome::Reset);
        assert_eq!(Outcome::of(Some(200)), Outcome::Success);
        assert_eq!(Outcome::of(Some(429)), Outcome::RateLimited);
        assert_eq!(Outcome::of(Some(404)), Outcome::ClientError);
        assert_eq!(Outcome::of(Some(503)), Outcome::ServerError);
    }

    #[test]
    fn emits_request_latency_and_tokens() {
        let mut m = MemoryMetrics::default();
        CallRecord {
            priority: Priority::P0,
            model: "gpt-4o",
            status: Some(200),
            started_ms: 1000,
            first_byte_ms: Some(1200),
            ended_ms: 1500,
            usage: Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 0,
            }),
            refused: false,
        }
        .emit(&mut m);
        assert_eq!(
            m.counters["llm_filter_requests_total.priority.P0.model.gpt-4o.outcome.success"],
            1
        );
        assert_eq!(
            m.histograms["gen_ai_client_operation_duration_ms.model.gpt-4o"],
            [500]
        );
        assert_eq!(
            m.histograms["gen_ai_server_time_to_first_token_ms.model.gpt-4o"],
            [200]
        );
        assert_eq!(
            m.counters["gen_ai_client_token_usage_total.model.gpt-4o.token_type.input"],
            10
        );
        assert!(!m
            .counters
            .contains_key("gen_ai_client_token_usage_total.model.gpt-4o.token_type.output"));
    }

    #[test]
    fn clock_going_backwards_does_not_underflow() {
        let mut m = MemoryMetrics::default();
        CallRecord {
            model: "m",
            started_ms: 10,
            first_byte_ms: Some(5),
            ended_ms: 1,
            ..Default::default()
        }
        .emit(&mut m);
        assert_eq!(
            m.histograms["gen_ai_client_operation_duration_ms.model.m"],
            [0]
        );
    }
}

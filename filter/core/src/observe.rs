//! The filter's request metrics: what one LLM call looked like from the proxy
//! (how it ended, timings, tokens), counted when the call ends.

use crate::host::Metrics;
use crate::metrics;
use crate::summary::{CallSummary, End};

/// How a call ended for the client, as the requests counter's `outcome`
/// label (see [`crate::summary`] for how it relates to the other policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// 2xx (or 1xx/3xx: the call was answered).
    Success,
    /// 429 from upstream.
    RateLimited,
    /// Other 4xx.
    ClientError,
    /// 5xx, Envoy's own timeout reply included.
    ServerError,
    /// No response: the upstream reset, or the client left.
    Reset,
    /// The answer began but never ended (the upstream reset mid-answer, or
    /// the client left).
    Incomplete,
    /// The filter refused the call itself (shed, circuit open, budget spent).
    Refused,
}

impl RequestOutcome {
    /// The outcome of a call that ended as `end`.
    pub fn of(end: End) -> Self {
        match end {
            End::Local(400..) => Self::Refused,
            // A dropped try is never a call's end; counted as no answer.
            End::Reset(_) | End::Abandoned | End::Outlasted => Self::Reset,
            End::Cut(_) => Self::Incomplete,
            End::Local(s) | End::Answered(s) | End::TimedOut(s) | End::NoCredential(s) => {
                Self::of_status(s)
            }
        }
    }

    fn of_status(status: u16) -> Self {
        match status {
            429 => Self::RateLimited,
            400..=499 => Self::ClientError,
            500..=599 => Self::ServerError,
            _ => Self::Success,
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
            Self::Incomplete => "incomplete",
            Self::Refused => "refused",
        }
    }
}

/// Emits the request metrics of a finished call: the requests counter, the
/// duration and time-to-first-token histograms, and the token counters, each
/// with a `group` label when the call is in an A/B group.
pub fn record(m: &mut dyn Metrics, call: &CallSummary<'_>) {
    let outcome = RequestOutcome::of(call.end());
    let api = call.api.api();
    let requests = [
        ("priority", call.priority.as_str()),
        ("model", call.model),
        ("outcome", outcome.as_str()),
        ("api", api),
    ];
    let requests = Labels::with_group(&requests, call.group);
    m.counter_with(metrics::REQUESTS, requests.get(), 1);
    let model = Labels::with_group(&[("model", call.model), ("api", api)], call.group);
    m.histogram_with(
        metrics::OPERATION_DURATION,
        model.get(),
        call.served.elapsed_ms(),
    );
    if let Some(first) = call.served.first_byte_after_ms() {
        m.histogram_with(metrics::TIME_TO_FIRST_TOKEN, model.get(), first);
    }
    if let Some(us) = time_per_output_token_us(call) {
        m.histogram_with(metrics::TIME_PER_OUTPUT_TOKEN, model.get(), us);
    }
    if let Some(u) = call.served.usage {
        for (kind, n) in [
            ("input", u.prompt_tokens),
            ("output", u.completion_tokens),
            ("cached_input", u.cached_tokens),
            ("cache_creation_input", u.cache_write_tokens),
        ] {
            if n > 0 {
                let labels = [("model", call.model), ("token_type", kind), ("api", api)];
                let labels = Labels::with_group(&labels, call.group);
                m.counter_with(metrics::TOKEN_USAGE, labels.get(), n);
            }
        }
    }
}

/// The time per output token after the first of a stream that ended with
/// its usage, µs: from the first event to the end, over the tokens after the
/// first. `None` for a JSON answer (its first byte is its whole answer) and a
/// stream of fewer than two tokens.
pub fn time_per_output_token_us(call: &CallSummary<'_>) -> Option<u64> {
    let tokens = call.served.usage?.completion_tokens;
    if !call.served.streamed || tokens < 2 || !matches!(call.end(), End::Answered(200..=299)) {
        return None;
    }
    let after_first_ms = call
        .served
        .ended_ms
        .checked_sub(call.served.first_byte_ms?)?;
    Some(after_first_ms.saturating_mul(1000) / (tokens - 1))
}

/// A metric's labels and the call's `group`, when it has one, on the stack.
struct Labels<'a> {
    all: [(&'static str, &'a str); 5],
    len: usize,
}

impl<'a> Labels<'a> {
    fn with_group(labels: &[(&'static str, &'a str)], group: Option<&'a str>) -> Self {
        let mut out = Self {
            all: [("", ""); 5],
            len: 0,
        };
        for label in labels.iter().copied().chain(group.map(|g| ("group", g))) {
            if let Some(slot) = out.all.get_mut(out.len) {
                *slot = label;
                out.len += 1;
            }
        }
        out
    }

    fn get(&self) -> &[(&'static str, &'a str)] {
        self.all.get(..self.len).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryMetrics;
    use crate::priority::Priority;
    use crate::summary::Try;
    use crate::usage::Usage;

    #[test]
    fn outcome_by_end() {
        for (end, want) in [
            (End::Abandoned, RequestOutcome::Reset),
            (End::Reset(503), RequestOutcome::Reset),
            (End::Answered(200), RequestOutcome::Success),
            (End::Answered(101), RequestOutcome::Success),
            (End::Answered(429), RequestOutcome::RateLimited),
            (End::Answered(404), RequestOutcome::ClientError),
            (End::Answered(503), RequestOutcome::ServerError),
            (End::NoCredential(503), RequestOutcome::ServerError),
            (End::TimedOut(504), RequestOutcome::ServerError),
            (End::Cut(200), RequestOutcome::Incomplete),
            (End::Local(200), RequestOutcome::Success),
            (End::Local(429), RequestOutcome::Refused),
            (End::Local(503), RequestOutcome::Refused),
        ] {
            assert_eq!(RequestOutcome::of(end), want, "{end:?}");
        }
    }

    #[test]
    fn emits_request_latency_and_tokens() {
        let mut m = MemoryMetrics::default();
        record(
            &mut m,
            &CallSummary {
                priority: Priority::P0,
                model: "gpt-4o",
                served: Try {
                    started_ms: 1000,
                    first_byte_ms: Some(1200),
                    ended_ms: 1500,
                    usage: Some(Usage {
                        prompt_tokens: 10,
                        completion_tokens: 0,
                        cached_tokens: 0,
                        ..Usage::default()
                    }),
                    ..Try::ended(End::Answered(200))
                },
                ..CallSummary::ended(End::Answered(200))
            },
        );
        assert_eq!(
            m.counters
                ["llm_filter_requests_totalpriority=.=P0;.;model=.=gpt-4o;.;outcome=.=success;.;api=.=chat;.;"],
            1
        );
        assert_eq!(
            m.histograms["gen_ai_client_operation_duration_msmodel=.=gpt-4o;.;api=.=chat;.;"],
            [500]
        );
        assert_eq!(
            m.histograms["gen_ai_server_time_to_first_token_msmodel=.=gpt-4o;.;api=.=chat;.;"],
            [200]
        );
        assert_eq!(
            m.counters["gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=input;.;api=.=chat;.;"],
            10
        );
        assert!(!m.counters.contains_key(
            "gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=output;.;api=.=chat;.;"
        ));
    }

    #[test]
    fn a_group_labels_requests_latency_and_tokens() {
        let mut m = MemoryMetrics::default();
        record(
            &mut m,
            &CallSummary {
                model: "m",
                group: Some("b"),
                served: Try {
                    ended_ms: 40,
                    first_byte_ms: Some(10),
                    usage: Some(Usage {
                        prompt_tokens: 1,
                        completion_tokens: 2,
                        cached_tokens: 0,
                        ..Usage::default()
                    }),
                    ..Try::ended(End::Answered(200))
                },
                ..CallSummary::ended(End::Answered(200))
            },
        );
        assert_eq!(
            m.counters["llm_filter_requests_totalpriority=.=P1;.;model=.=m;.;outcome=.=success;.;api=.=chat;.;group=.=b;.;"],
            1
        );
        assert_eq!(
            m.histograms
                ["gen_ai_client_operation_duration_msmodel=.=m;.;api=.=chat;.;group=.=b;.;"],
            [40]
        );
        assert_eq!(
            m.histograms
                ["gen_ai_server_time_to_first_token_msmodel=.=m;.;api=.=chat;.;group=.=b;.;"],
            [10]
        );
        assert_eq!(
            m.counters
                ["gen_ai_client_token_usage_totalmodel=.=m;.;token_type=.=output;.;api=.=chat;.;group=.=b;.;"],
            2
        );
    }

    #[test]
    fn clock_going_backwards_does_not_underflow() {
        let mut m = MemoryMetrics::default();
        record(
            &mut m,
            &CallSummary {
                model: "m",
                served: Try {
                    started_ms: 10,
                    first_byte_ms: Some(5),
                    ended_ms: 1,
                    ..Try::ended(End::Abandoned)
                },
                ..CallSummary::ended(End::Abandoned)
            },
        );
        assert_eq!(
            m.histograms["gen_ai_client_operation_duration_msmodel=.=m;.;api=.=chat;.;"],
            [0]
        );
    }

    #[test]
    fn time_per_output_token_is_read_from_streams_only() {
        let stream = CallSummary {
            served: Try {
                streamed: true,
                first_byte_ms: Some(300),
                ended_ms: 1_300,
                usage: Some(Usage {
                    prompt_tokens: 10,
                    completion_tokens: 51,
                    cached_tokens: 0,
                    ..Usage::default()
                }),
                ..Try::ended(End::Answered(200))
            },
            ..CallSummary::ended(End::Answered(200))
        };
        assert_eq!(time_per_output_token_us(&stream), Some(20_000));
        let mut m = MemoryMetrics::default();
        record(&mut m, &stream);
        assert_eq!(
            m.histograms["gen_ai_server_time_per_output_token_usmodel=.=m;.;api=.=chat;.;"],
            [20_000]
        );
        let json = CallSummary {
            served: Try {
                streamed: false,
                ..stream.served
            },
            ..stream
        };
        assert_eq!(time_per_output_token_us(&json), None);
        let one = CallSummary {
            served: Try {
                usage: Some(Usage {
                    completion_tokens: 1,
                    ..Usage::default()
                }),
                ..stream.served
            },
            ..stream
        };
        assert_eq!(time_per_output_token_us(&one), None);
        let failed = CallSummary {
            served: Try {
                end: End::Cut(200),
                ..stream.served
            },
            ..stream
        };
        assert_eq!(time_per_output_token_us(&failed), None);
    }
}

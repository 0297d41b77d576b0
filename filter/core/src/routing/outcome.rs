//! How a call to a cluster ended as routing sees it: the result the
//! response (or its absence) showed, and what that says about the backend.
//! The walk's one classification of a call's end is mapped to it once, where
//! routing learns from the call.

/// How a call to a cluster ended, as the response (or its absence) showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    /// A response with this status.
    Status(u16),
    /// The connection or stream was reset before a complete response.
    Reset,
    /// No response in time.
    Timeout,
    /// The client went away before any response: says nothing about the
    /// backend (Envoy's outlier detection does not count it either).
    Cancelled,
    /// Another backend answered the call first (a hedge won) while this one
    /// had not: it was at least this slow, which its tail must know, or
    /// hedging would hide the very tail it answers.
    Outlasted,
}

/// What a call's result says about the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A good answer: counts as success and as a latency sample.
    Success,
    /// The backend answered but refused the request (4xx but 429): the
    /// backend is alive, the latency says nothing about it.
    Refused,
    /// 5xx, 429, reset or timeout: counts against the backend.
    Failure,
    /// Nothing learnt: the call only leaves the in-flight count.
    Unknown,
    /// Slower than its latency, which is a lower bound: a latency sample,
    /// neither success nor failure.
    Slow,
}

impl CallResult {
    /// What the result says about the backend.
    pub fn verdict(self) -> Verdict {
        match self {
            Self::Status(200..=399) => Verdict::Success,
            Self::Status(429) => Verdict::Failure,
            Self::Status(400..=499) => Verdict::Refused,
            Self::Status(_) | Self::Reset | Self::Timeout => Verdict::Failure,
            Self::Cancelled => Verdict::Unknown,
            Self::Outlasted => Verdict::Slow,
        }
    }

    /// The `outcome` metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Status(200..=399) => "success",
            Self::Status(429) => "rate_limited",
            Self::Status(400..=499) => "client_error",
            Self::Status(_) => "server_error",
            Self::Reset => "reset",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Outlasted => "outlasted",
        }
    }
}

/// One completed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallSample {
    /// How it ended.
    pub result: CallResult,
    /// From dispatch to the end of the response, ms.
    pub latency_ms: u64,
    /// From dispatch to the first response body byte, ms, when one came.
    pub ttft_ms: Option<u64>,
    /// The call was a stream: its speed is its time to the first byte, not
    /// its length, which the answer's length sets.
    pub streamed: bool,
    /// Output tokens the backend reported, when it did: a non-streamed
    /// call's time to the end is judged per token of its answer.
    pub output_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_and_labels() {
        for (r, v, l) in [
            (CallResult::Status(200), Verdict::Success, "success"),
            (CallResult::Status(304), Verdict::Success, "success"),
            (CallResult::Status(404), Verdict::Refused, "client_error"),
            (CallResult::Status(429), Verdict::Failure, "rate_limited"),
            (CallResult::Status(500), Verdict::Failure, "server_error"),
            (CallResult::Status(0), Verdict::Failure, "server_error"),
            (CallResult::Status(101), Verdict::Failure, "server_error"),
            (CallResult::Reset, Verdict::Failure, "reset"),
            (CallResult::Timeout, Verdict::Failure, "timeout"),
            (CallResult::Outlasted, Verdict::Slow, "outlasted"),
        ] {
            assert_eq!((r.verdict(), r.label()), (v, l), "{r:?}");
        }
    }
}

//! The prefix-cache phase (issue 22): conversations whose every turn resends
//! the growing history against three equal backends that each play a model
//! server's prefix cache, so a turn that reaches the backend of its earlier
//! turns is prefilled only for what is new. Plain Envoy spreading the calls at
//! random over the three against Envoy with llm-filter configured with the
//! model's backends and nothing else (affinity is on by default): how many
//! calls find their prefix warm, and what that does to latency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use llm_filter_e2e::{http_client, prometheus, EnvoyBuilder, MockConfig, MockUpstream};
use serde_json::{json, Value};

use super::{mix, ms, percentile, FilterCounters, CLUSTER_HEADER, MODEL, ROUTE_TIMEOUT_MS, VHOST};

/// Conversations, and the turns of each, as the issue filed them.
pub const CONVERSATIONS: usize = 24;
pub const TURNS: usize = 5;
/// Words (the mock's tokens) of each conversation's system prompt: above the
/// 1024 tokens providers start caching at, and the size of a real agent's
/// instructions and tool descriptions.
const SYSTEM_TOKENS: usize = 2000;
/// Words of each user turn and of each assistant reply resent with the history.
const USER_TOKENS: usize = 40;
const REPLY_TOKENS: usize = 60;
/// The part of every answer's latency that no cache saves: queueing,
/// scheduling and decoding a short answer (about 50 tokens at ~5 ms each).
const FIXED_MS: u64 = 250;
/// Prefill time of each prompt token the backend's prefix cache misses:
/// 4,000 tokens/s, a 70B-class model on one node under load (vLLM, SGLang).
/// A cold 2,000-token system prompt then costs 500 ms on top of the fixed
/// part, a warm one almost nothing: a first token about 2.5 times sooner,
/// within the "up to 80 % lower latency" providers state for cached prompts.
const PREFILL_US_PER_TOKEN: u64 = 250;
/// The three equal backends.
const BACKENDS: [&str; 3] = ["a", "b", "c"];

/// Who spreads the calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Side {
    /// Plain Envoy; the load generator names a backend drawn at random (from
    /// the seed) per call in the header the route reads.
    Plain,
    /// Envoy with llm-filter, `routing.models` only.
    Filter,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Plain => "plain Envoy, random spread",
            Side::Filter => "llm-filter, routing.models only",
        }
    }
}

/// The body of turn `turn` (from 0) of conversation `conversation`: its own
/// system prompt, then every earlier turn with a fixed reply (the same bytes
/// on both sides, whatever a backend answered), then the new question.
pub fn body(seed: u64, conversation: usize, turn: usize) -> Value {
    let words = |what: &str, n: usize, salt: u64| -> String {
        (0..n)
            .map(|i| format!("{what}{}", mix(salt ^ mix(i as u64)) % 1000))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let tag = seed ^ mix(conversation as u64);
    let mut messages = vec![json!({
        "role": "system",
        "content": format!(
            "Conversation {conversation}: you are the support agent of account {tag:x}. {}",
            words("rule", SYSTEM_TOKENS, tag)
        ),
    })];
    for t in 0..=turn {
        let salt = mix(tag ^ (t as u64 + 1));
        messages.push(json!({"role": "user", "content": format!("Question {t}: {}", words("ask", USER_TOKENS, salt))}));
        if t < turn {
            messages.push(json!({"role": "assistant", "content": format!("Answer {t}: {}", words("say", REPLY_TOKENS, !salt))}));
        }
    }
    json!({"model": MODEL, "temperature": 0, "messages": messages})
}

/// One call as the client saw it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Call {
    pub turn: usize,
    pub latency_ms: f64,
    /// 0: no response.
    pub status: u16,
    /// The usage's `prompt_tokens` and `prompt_tokens_details.cached_tokens`.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

impl Call {
    fn failed(&self) -> bool {
        !(200..300).contains(&self.status)
    }
}

/// What one side measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Summary {
    pub calls: usize,
    pub errors: usize,
    /// Calls answered with a warm prefix, and those that could have been
    /// (every turn but a conversation's first).
    pub warm: usize,
    pub could: usize,
    pub cached_tokens: u64,
    pub prompt_tokens: u64,
    pub mean_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Median latency of the later turns, warm and cold apart.
    pub warm_p50_ms: Option<f64>,
    pub cold_p50_ms: Option<f64>,
}

impl Summary {
    pub fn of(calls: &[Call]) -> Self {
        let sorted = |filter: &dyn Fn(&Call) -> bool| {
            let mut v: Vec<f64> = calls
                .iter()
                .filter(|c| filter(c))
                .map(|c| c.latency_ms)
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let all = sorted(&|_| true);
        let later =
            |warm: bool| sorted(&|c| c.turn > 0 && !c.failed() && (c.cached_tokens > 0) == warm);
        Summary {
            calls: calls.len(),
            errors: calls.iter().filter(|c| c.failed()).count(),
            warm: calls.iter().filter(|c| c.cached_tokens > 0).count(),
            could: calls.iter().filter(|c| c.turn > 0).count(),
            cached_tokens: calls.iter().map(|c| c.cached_tokens).sum(),
            prompt_tokens: calls.iter().map(|c| c.prompt_tokens).sum(),
            mean_ms: (!all.is_empty()).then(|| all.iter().sum::<f64>() / all.len() as f64),
            p50_ms: percentile(&all, 50.0),
            p99_ms: percentile(&all, 99.0),
            warm_p50_ms: percentile(&later(true), 50.0),
            cold_p50_ms: percentile(&later(false), 50.0),
        }
    }

    /// Calls with a warm prefix over all calls (at best `could / calls`).
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.warm as f64, self.calls as f64)
    }

    pub fn token_ratio(&self) -> f64 {
        ratio(self.cached_tokens as f64, self.prompt_tokens as f64)
    }
}

fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        0.0
    }
}

/// One side of the phase, measured.
#[derive(Debug, Clone)]
pub struct Run {
    pub side: Side,
    pub summary: Summary,
    /// Calls each backend received, in [`BACKENDS`] order.
    pub upstream_calls: Vec<usize>,
    /// The filter's hedges and failovers; `None` on the plain side.
    pub filter: Option<FilterCounters>,
    /// Cached over input tokens as the filter's own metric counts them (the
    /// "is my prompt cache warm" query); `None` on the plain side.
    pub metric_token_ratio: Option<f64>,
}

/// `llm_filter_routing_tokens_total`'s cached input over its input.
fn metric_token_ratio(samples: &[prometheus::Sample]) -> f64 {
    let tokens = |kind| prometheus::sum(samples, TOKENS, &[("token_type", kind)]);
    ratio(tokens("cached_input"), tokens("input"))
}

const TOKENS: &str = "llm_filter_routing_tokens_total";

fn start_mock(name: &str) -> Result<MockUpstream> {
    let mock = MockUpstream::try_start(MockConfig {
        default_delay_ms: FIXED_MS,
        ..MockConfig::named(name)
    })
    .with_context(|| format!("mock {name}"))?;
    mock.set_prompt_cache(true);
    mock.set_prefill_us_per_token(PREFILL_US_PER_TOKEN);
    Ok(mock)
}

fn envoy(side: Side, mocks: &[MockUpstream]) -> EnvoyBuilder {
    let builder = match side {
        Side::Plain => EnvoyBuilder::new().no_filter(),
        Side::Filter => {
            let backends: Vec<Value> = mocks.iter().map(|m| json!({"cluster": m.name()})).collect();
            EnvoyBuilder::new().plugin_config(json!({"routing": {"models": {MODEL: backends}}}))
        }
    };
    let mut builder = builder
        .concurrency(2)
        .header_route(CLUSTER_HEADER)
        .route_timeout_ms(ROUTE_TIMEOUT_MS)
        .virtual_host_yaml(VHOST);
    for mock in mocks {
        builder = builder.upstream(mock.name(), mock.port());
    }
    builder
}

/// Fresh mocks and a fresh Envoy; `clients` loops, each taking the next
/// conversation and sending its turns one after the other.
pub async fn run_one(side: Side, seed: u64, clients: usize, deadline: Duration) -> Result<Run> {
    let mocks = BACKENDS
        .iter()
        .map(|n| start_mock(n))
        .collect::<Result<Vec<_>>>()?;
    let envoy = envoy(side, &mocks).start().context("envoy under test")?;
    let url = envoy.url("/v1/chat/completions");
    let client = http_client();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + deadline;
    let mut tasks = Vec::new();
    for _ in 0..clients.clamp(1, CONVERSATIONS) {
        let (client, next, url) = (client.clone(), Arc::clone(&next), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let conversation = next.fetch_add(1, Ordering::SeqCst);
                if conversation >= CONVERSATIONS {
                    return done;
                }
                for turn in 0..TURNS {
                    if Instant::now() >= deadline {
                        return done;
                    }
                    let mut request = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body(seed, conversation, turn).to_string());
                    if side == Side::Plain {
                        request = request
                            .header(CLUSTER_HEADER, random_backend(seed, conversation, turn));
                    }
                    done.push(call(request, turn).await);
                }
            }
        }));
    }
    let mut done = Vec::new();
    for task in tasks {
        if let Ok(calls) = task.await {
            done.extend(calls);
        }
    }
    eprintln!(
        "bench-tail: prefix / {}: {} calls in {:.1} s",
        side.name(),
        done.len(),
        started.elapsed().as_secs_f64()
    );
    // Envoy counts a stream when it logs it, just after its last byte.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let samples = envoy.metrics();
    Ok(Run {
        side,
        filter: (side == Side::Filter).then(|| FilterCounters::read(&samples)),
        metric_token_ratio: (side == Side::Filter).then(|| metric_token_ratio(&samples)),
        summary: Summary::of(&done),
        upstream_calls: mocks
            .iter()
            .map(|m| m.count("POST", "/v1/chat/completions"))
            .collect(),
    })
}

/// The plain side's backend of one call: a seeded draw, so runs compare.
pub fn random_backend(seed: u64, conversation: usize, turn: usize) -> &'static str {
    let n = (conversation * TURNS + turn) as u64;
    let i = (mix(seed ^ mix(n ^ 0x70_72_65_66)) % BACKENDS.len() as u64) as usize;
    BACKENDS.get(i).copied().unwrap_or("a")
}

async fn call(request: reqwest::RequestBuilder, turn: usize) -> Call {
    let started = Instant::now();
    let (status, usage) = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.bytes().await {
                Ok(body) => (
                    status,
                    serde_json::from_slice::<Value>(&body)
                        .ok()
                        .and_then(|v| v.get("usage").cloned()),
                ),
                Err(_) => (0, None),
            }
        }
        Err(_) => (0, None),
    };
    let tokens = |pointer: &str| {
        usage
            .as_ref()
            .and_then(|u| u.pointer(pointer)?.as_u64())
            .unwrap_or(0)
    };
    Call {
        turn,
        latency_ms: started.elapsed().as_secs_f64() * 1000.0,
        status,
        prompt_tokens: tokens("/prompt_tokens"),
        cached_tokens: tokens("/prompt_tokens_details/cached_tokens"),
    }
}

/// The phase's markdown table.
pub fn table(runs: &[Run], seed: u64, clients: usize) -> String {
    let mut out = format!(
        "\n{CONVERSATIONS} conversations of {TURNS} turns ({} at a time), seed {seed}, three equal \
         backends playing a prefix cache: {FIXED_MS} ms + {PREFILL_US_PER_TOKEN} µs per uncached \
         prompt token, system prompts of {SYSTEM_TOKENS} tokens. Best hit ratio {:.2}.\n\n",
        clients.clamp(1, CONVERSATIONS),
        ratio((TURNS - 1) as f64, TURNS as f64),
    );
    out.push_str(
        "| side | calls | warm / could be | hit ratio | cached / prompt tokens | mean ms | p50 ms | p99 ms \
         | later turns p50 warm / cold ms | errors | upstream calls a / b / c | hedges / failovers |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for run in runs {
        let s = &run.summary;
        out.push_str(&format!(
            "| {} | {} | {} / {} | {:.2} | {:.2} | {} | {} | {} | {} / {} | {} | {} | {} |\n",
            run.side.name(),
            s.calls,
            s.warm,
            s.could,
            s.hit_ratio(),
            s.token_ratio(),
            ms(s.mean_ms),
            ms(s.p50_ms),
            ms(s.p99_ms),
            ms(s.warm_p50_ms),
            ms(s.cold_p50_ms),
            s.errors,
            run.upstream_calls
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" / "),
            run.filter.map_or_else(
                || "-".to_string(),
                |f| format!("{} / {}", f.hedges, f.failovers)
            ),
        ));
    }
    for run in runs {
        if let Some(r) = run.metric_token_ratio {
            out.push_str(&format!(
                "\n{}: `{TOKENS}` counts cached_input / input = {r:.2}\n",
                run.side.name()
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(body: &Value, i: usize) -> String {
        body["messages"][i]["content"].as_str().unwrap().to_string()
    }

    #[test]
    fn each_turn_resends_the_last_and_conversations_share_nothing() {
        let first = body(9, 3, 0);
        let later = body(9, 3, 4);
        assert_eq!(first["messages"].as_array().unwrap().len(), 2);
        assert_eq!(later["messages"].as_array().unwrap().len(), 10);
        for turn in 1..TURNS {
            let (before, now) = (body(9, 3, turn - 1), body(9, 3, turn));
            let n = before["messages"].as_array().unwrap().len();
            assert_eq!(
                now["messages"].as_array().unwrap()[..n],
                before["messages"].as_array().unwrap()[..]
            );
        }
        let system = text(&first, 0);
        assert!(system.split_whitespace().count() > SYSTEM_TOKENS);
        let other = text(&body(9, 4, 0), 0);
        assert_ne!(system.split_whitespace().next(), None);
        assert_ne!(system[..20], other[..20]);
        assert_eq!(body(9, 3, 2), body(9, 3, 2));
    }

    #[test]
    fn the_plain_spread_is_seeded_and_even() {
        let picks: Vec<&str> = (0..CONVERSATIONS)
            .flat_map(|c| (0..TURNS).map(move |t| random_backend(9, c, t)))
            .collect();
        for name in BACKENDS {
            let n = picks.iter().filter(|p| **p == name).count();
            assert!((25..=55).contains(&n), "{name}: {n}");
        }
        assert_eq!(random_backend(9, 5, 2), random_backend(9, 5, 2));
    }

    #[test]
    fn a_summary_counts_warm_calls_against_all() {
        let call = |turn, latency_ms, cached_tokens, status| Call {
            turn,
            latency_ms,
            status,
            prompt_tokens: 100,
            cached_tokens,
        };
        let calls = [
            call(0, 700.0, 0, 200),
            call(1, 260.0, 90, 200),
            call(2, 750.0, 0, 200),
            call(3, 270.0, 95, 200),
            call(4, 5.0, 0, 503),
        ];
        let s = Summary::of(&calls);
        assert_eq!((s.calls, s.errors, s.warm, s.could), (5, 1, 2, 4));
        assert!((s.hit_ratio() - 0.4).abs() < 1e-9);
        assert!((s.token_ratio() - 185.0 / 500.0).abs() < 1e-9);
        assert_eq!((s.warm_p50_ms, s.cold_p50_ms), (Some(260.0), Some(750.0)));
        assert_eq!(s.mean_ms, Some(397.0));
        assert_eq!(Summary::of(&[]).hit_ratio(), 0.0);
        assert_eq!(Summary::of(&[]).mean_ms, None);
        let run = Run {
            side: Side::Filter,
            summary: s,
            upstream_calls: vec![2, 2, 1],
            filter: Some(FilterCounters::default()),
            metric_token_ratio: Some(0.5),
        };
        let text = table(&[run], 9, 8);
        assert!(
            text.contains("| llm-filter, routing.models only | 5 | 2 / 4 | 0.40 | 0.37 |"),
            "{text}"
        );
        assert!(text.contains("Best hit ratio 0.80"), "{text}");
        assert!(text.contains("| 2 / 2 / 1 | 0 / 0 |"), "{text}");
        assert!(text.contains("cached_input / input = 0.50"), "{text}");
        let samples = prometheus::parse(
            "llm_filter_routing_tokens_total{model=\"gpt-4o\",llm_cluster=\"a\",token_type=\"input\"} 400\n\
             llm_filter_routing_tokens_total{model=\"gpt-4o\",llm_cluster=\"b\",token_type=\"input\"} 100\n\
             llm_filter_routing_tokens_total{model=\"gpt-4o\",llm_cluster=\"a\",token_type=\"cached_input\"} 300\n",
        );
        assert!((metric_token_ratio(&samples) - 0.6).abs() < 1e-9);
    }
}

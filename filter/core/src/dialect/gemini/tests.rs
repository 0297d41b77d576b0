use serde_json::json;

use super::*;
use crate::dialect::answer::google::quota_spent;
use crate::dialect::gemini::stream::Gemini as Events;
use crate::dialect::Dialect;
use crate::sse::reader::Event;
use crate::sse::Stream as SseStream;
use crate::sse::{Grammar, Parsed};
use crate::usage::MAX_FINISH_REASONS;

/// A stream as Google's servers frame it (`data: {json}\r\n\r\n`), the
/// usage so far in every event, the finish reason in the last.
const STREAM: &str = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 5,\"candidatesTokenCount\": 1,\"totalTokenCount\": 192,\"thoughtsTokenCount\": 186},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"r1\"}\r\n\r\n\
data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"thinking\", \"thought\": true}, {\"text\": \"lo\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 5,\"candidatesTokenCount\": 2,\"totalTokenCount\": 193,\"thoughtsTokenCount\": 186},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"r1\"}\r\n\r\n\
data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \" there\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 5,\"candidatesTokenCount\": 3,\"totalTokenCount\": 198,\"cachedContentTokenCount\": 4,\"thoughtsTokenCount\": 186},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"r1\"}\r\n\r\n";

fn counted(prompt: u64, completion: u64, cached: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_tokens: cached,
        ..Usage::default()
    }
}

fn feed(pieces: &[&[u8]]) -> SseStream<Events> {
    let mut s = SseStream::with_grammar(Events::default());
    s.keep_text(1024);
    for p in pieces {
        s.feed(p, false, None);
    }
    s
}

#[test]
fn knows_a_generation_call_by_its_path() {
    let call = |version, model, stream, sse| {
        Some(Call {
            version,
            model,
            stream,
            sse,
        })
    };
    for (path, want) in [
        (
            "/v1beta/models/gemini-2.5-flash:generateContent",
            call("v1beta", "gemini-2.5-flash", false, false),
        ),
        (
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            call("v1beta", "gemini-2.5-flash", true, true),
        ),
        (
            "/v1/models/g:streamGenerateContent?key=k&alt=sse",
            call("v1", "g", true, true),
        ),
        (
            "/v1beta/models/g:streamGenerateContent",
            call("v1beta", "g", true, false),
        ),
        (
            "/v1beta/models/g:streamGenerateContent?alt=json",
            call("v1beta", "g", true, false),
        ),
        (
            "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.0-flash-001:generateContent",
            call("v1", "gemini-2.0-flash-001", false, false),
        ),
        (
            "/v1beta/models/g:generateContent#x:y",
            call("v1beta", "g", false, false),
        ),
        ("/v1beta/models/g:countTokens", None),
        ("/v1beta/models/g:embedContent", None),
        ("/v1beta/models/:generateContent", None),
        ("/v1beta/models/a b:generateContent", None),
        ("/v1beta/models/a%2Fb:generateContent", None),
        ("/v1beta/tunedModels/g:generateContent", None),
        ("/models/g:generateContent", None),
        ("v1beta/models/g:generateContent", None),
        ("/v1beta/models/g:generateContent/x", None),
        ("/v1beta/models/g:GenerateContent", None),
        ("/v1/chat/completions", None),
        ("", None),
        (":", None),
    ] {
        assert_eq!(call_of(path), want, "{path}");
    }
    let long = format!("/v1/models/{}:generateContent", "m".repeat(MAX_MODEL + 1));
    assert_eq!(call_of(&long), None);
    let ok = format!("/v1/models/{}:generateContent", "m".repeat(MAX_MODEL));
    assert_eq!(model(&ok).map(str::len), Some(MAX_MODEL));
    let huge = format!("/v1/{}models/m:generateContent", "a/".repeat(MAX_PATH));
    assert_eq!(call_of(&huge), None);
}

#[test]
fn the_model_is_rewritten_in_the_path_alone() {
    for (path, model, want) in [
        (
            "/v1beta/models/gemini-2.5-flash:generateContent",
            "gemini-a",
            Some("/v1beta/models/gemini-a:generateContent"),
        ),
        (
            "/v1beta/models/g:streamGenerateContent?alt=sse&x=models/g:y",
            "gemini-2.5-pro@001",
            Some("/v1beta/models/gemini-2.5-pro@001:streamGenerateContent?alt=sse&x=models/g:y"),
        ),
        (
            "/v1/projects/p/locations/l/publishers/google/models/m:generateContent",
            "n",
            Some("/v1/projects/p/locations/l/publishers/google/models/n:generateContent"),
        ),
        ("/v1beta/models/g:generateContent", "a/b", None),
        ("/v1beta/models/g:generateContent", "a:b", None),
        ("/v1beta/models/g:generateContent", "", None),
        ("/v1/chat/completions", "g", None),
    ] {
        assert_eq!(with_model(path, model).as_deref(), want, "{path} → {model}");
    }
}

#[test]
fn a_key_in_the_query_is_found_and_taken_out() {
    for (path, key, without) in [
        (
            "/v1beta/models/g:streamGenerateContent?alt=sse&key=AIza-1",
            Some("AIza-1"),
            Some("/v1beta/models/g:streamGenerateContent?alt=sse"),
        ),
        (
            "/v1beta/models/g:generateContent?key=AIza-1",
            Some("AIza-1"),
            Some("/v1beta/models/g:generateContent"),
        ),
        (
            "/v1beta/models/g:generateContent?key=&key=k2&alt=sse#f",
            Some("k2"),
            Some("/v1beta/models/g:generateContent?alt=sse#f"),
        ),
        ("/v1beta/models/g:generateContent?monkey=x&key=", None, None),
        ("/v1beta/models/g:generateContent?alt=sse", None, None),
        (
            "/v1beta/models/g:generateContent#?key=x",
            Some("x"),
            Some("/v1beta/models/g:generateContent#"),
        ),
        ("/v1beta/models/g:generateContent", None, None),
    ] {
        assert_eq!(query_key(path), key, "{path}");
        assert_eq!(without_query_key(path).as_deref(), without, "{path}");
    }
}

#[test]
fn the_prompt_is_read_in_order_with_tool_calls() {
    let body = Json::parse(
        br#"{
        "systemInstruction": {"parts": [{"text": "be brief"}, {"inlineData": {}}], "role": "user"},
        "contents": [
            {"parts": [{"text": "hi"}, {"text": "there"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"r": 2}}}, {"fileData": {}}]},
            {"role": "model", "parts": [{"text": "done"}]},
            "not a turn",
            {"parts": "not parts"}
        ],
        "tools": [{"functionDeclarations": [{"name": "f", "description": "never prompt text"}]}]
    }"#,
    )
    .unwrap();
    let args = Json::parse(br#"{"a":1}"#).unwrap();
    let response = Json::parse(br#"{"r":2}"#).unwrap();
    let got: Vec<Text<'_>> = texts(&body).collect();
    assert_eq!(
        got,
        [
            Text::System("be brief"),
            Text::Turn {
                role: "user",
                text: "hi"
            },
            Text::Turn {
                role: "user",
                text: "there"
            },
            Text::ToolCall {
                name: "f",
                args: Some(&args)
            },
            Text::ToolResult {
                name: "f",
                response: Some(&response)
            },
            Text::Turn {
                role: "model",
                text: "done"
            },
        ]
    );
    for other in [
        "{}",
        "[]",
        r#"{"contents":{}}"#,
        r#"{"systemInstruction":"x"}"#,
    ] {
        assert_eq!(
            texts(&Json::parse(other.as_bytes()).unwrap()).count(),
            0,
            "{other}"
        );
    }
}

#[test]
fn contents_split_into_turns_a_call_with_its_answer() {
    let j = |s: &str| match Json::parse(s.as_bytes()).unwrap() {
        Json::Array(items) => items,
        _ => unreachable!(),
    };
    let contents = j(r#"[
        {"role": "user", "parts": [{"text": "q1"}]},
        {"role": "model", "parts": [{"text": "a1"}]},
        {"parts": [{"text": "q2"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f"}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f"}}]},
        {"role": "model", "parts": [{"text": "a2"}]},
        {"role": "user", "parts": [{"text": "q3"}]}
    ]"#);
    assert_eq!(
        turns(&contents),
        Some(Turns {
            starts: vec![true, false, true, false, false, false, true],
            current: 6
        })
    );
    // The current turn is a tool's answer: it belongs to the turn of q.
    let answering = j(r#"[
        {"role": "user", "parts": [{"text": "q"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f"}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f"}}]}
    ]"#);
    assert_eq!(turns(&answering).map(|t| t.current), Some(0));
    for bad in [
        "[]",
        r#"[{"role": "model", "parts": []}]"#,
        r#"[{"role": 1, "parts": []}]"#,
        r#"[{"role": "user", "role": "user", "parts": []}]"#,
        r#"["hi"]"#,
    ] {
        assert_eq!(turns(&j(bad)), None, "{bad}");
    }
}

#[test]
fn reads_the_output_cap_and_the_temperature() {
    let j = |s: &str| Json::parse(s.as_bytes()).unwrap();
    let body = j(r#"{"generationConfig":{"temperature":0.3,"maxOutputTokens":1e3}}"#);
    assert_eq!(output_cap(&body), Some(1000));
    assert_eq!(temperature(&body), Some(0.3));
    for other in [
        r#"{"generationConfig":{"maxOutputTokens":-1,"temperature":"hot"}}"#,
        r#"{"generationConfig":{"maxOutputTokens":1.5}}"#,
        r#"{"generationConfig":null}"#,
        r#"{"maxOutputTokens":10,"temperature":1}"#,
        "{}",
    ] {
        assert_eq!(output_cap(&j(other)), None, "{other}");
        assert_eq!(temperature(&j(other)), None, "{other}");
    }
}

#[test]
fn the_output_cap_is_lowered_in_place() {
    for (body, want) in [
        (
            r#"{"contents": [], "generationConfig": {"temperature": 0.70, "maxOutputTokens": 900}}"#,
            Some(
                r#"{"contents": [], "generationConfig": {"temperature": 0.70, "maxOutputTokens": 100}}"#,
            ),
        ),
        (
            r#"{"contents":[],"generationConfig":{"temperature":0.70}}"#,
            Some(
                r#"{"contents":[],"generationConfig":{"temperature":0.70,"maxOutputTokens":100}}"#,
            ),
        ),
        (
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":null}}"#,
            Some(r#"{"contents":[],"generationConfig":{"maxOutputTokens":100}}"#),
        ),
        (
            r#"{"contents":[]}"#,
            Some(r#"{"contents":[],"generationConfig":{"maxOutputTokens":100}}"#),
        ),
        (r#"{"generationConfig":{"maxOutputTokens":100}}"#, None),
        (r#"{"generationConfig":{"maxOutputTokens":50}}"#, None),
        (r#"{"generationConfig":{"maxOutputTokens":"900"}}"#, None),
        (r#"{"generationConfig":{"maxOutputTokens":900.5}}"#, None),
        (
            r#"{"generationConfig":{"maxOutputTokens":900,"maxOutputTokens":900}}"#,
            None,
        ),
        (r#"{"generationConfig":{},"generationConfig":{}}"#, None),
        (r#"{"generationConfig":[]}"#, None),
        (r#"{"generationConfig":3}"#, None),
        ("[]", None),
        ("not json", None),
    ] {
        let mut doc = Document::parse(body.as_bytes().to_vec());
        let changed = cap_output(&mut doc, 100);
        assert_eq!(changed, want.is_some(), "{body}");
        let got = String::from_utf8(doc.bytes().to_vec()).unwrap();
        assert_eq!(got, want.unwrap_or(body), "{body}");
        if changed {
            assert_eq!(doc.tree().and_then(output_cap), Some(100), "{body}");
            assert_eq!(
                Json::parse(doc.bytes()).as_ref().and_then(output_cap),
                Some(100)
            );
        }
    }
}

#[test]
fn the_temperature_is_set_in_place() {
    let mut doc =
        Document::parse(br#"{"generationConfig": {"temperature": 1, "topP": 0.9}}"#.to_vec());
    assert!(set_temperature(&mut doc, 0.25));
    assert_eq!(
        doc.bytes(),
        br#"{"generationConfig": {"temperature": 0.25, "topP": 0.9}}"#
    );
    assert_eq!(doc.tree().and_then(temperature), Some(0.25));
    for t in [f64::NAN, f64::INFINITY, -0.5] {
        assert!(!set_temperature(&mut doc, t), "{t}");
    }
}

#[test]
fn usage_is_read_from_usage_metadata() {
    // As the API reports a thinking model's call: the thoughts are output.
    let real = json!({"promptTokenCount": 5, "candidatesTokenCount": 39, "totalTokenCount": 230,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 5}], "thoughtsTokenCount": 186});
    let thinking = Usage {
        reasoning_tokens: 186,
        ..counted(5, 225, 0)
    };
    assert_eq!(usage(&real), Some(thinking));
    let cached = json!({"promptTokenCount": 100, "cachedContentTokenCount": 80, "candidatesTokenCount": 7,
        "toolUsePromptTokenCount": 3});
    assert_eq!(
        usage(&cached),
        Some(Usage {
            prompt_tokens: 103,
            completion_tokens: 7,
            cached_tokens: 80,
            ..Usage::default()
        })
    );
    assert_eq!(usage(&json!({})), Some(Usage::default()));
    assert_eq!(usage(&json!({"promptTokenCount": "5"})), None);
    assert_eq!(usage(&json!({"promptTokenCount": -5})), None);
    assert_eq!(usage(&json!(null)), None);
    assert_eq!(usage(&json!([1])), None);
    // The other dialects' names are not Gemini's.
    assert_eq!(
        usage(&json!({"prompt_tokens": 9, "input_tokens": 9})),
        Some(Usage::default())
    );
}

#[test]
fn reads_a_whole_answer() {
    let head = |body: &[u8]| Dialect::Gemini.answer().head(body);
    let body = br#"{"candidates":[{"content":{"parts":[{"text":"hi"}],"role":"model"},"finishReason":"STOP","index":0},
        {"content":{"parts":[]},"finishReason":"MAX_TOKENS","index":1}],
        "usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":2,"totalTokenCount":6,"cachedContentTokenCount":1},
        "modelVersion":"gemini-2.5-flash","responseId":"abc"}"#;
    let a = head(body);
    assert_eq!(
        a.usage,
        Some(Usage {
            prompt_tokens: 4,
            completion_tokens: 2,
            cached_tokens: 1,
            ..Usage::default()
        })
    );
    // Its id and model version are not read (no later call continues one).
    assert_eq!((&a.id, &a.model), (&None, &None));
    assert_eq!(a.finish_reasons(), ["STOP", "MAX_TOKENS"]);
    for junk in [
        &b"{"[..],
        b"[]",
        b"",
        br#"{"candidates":"x"}"#,
        br#"{"usageMetadata":[]}"#,
    ] {
        let a = head(junk);
        assert_eq!(a.usage, None, "{junk:?}");
        assert!(a.finish_reasons().is_empty(), "{junk:?}");
    }
    let many = format!(
        r#"{{"candidates":[{}]}}"#,
        vec![r#"{"finishReason":"STOP"}"#; 20].join(",")
    );
    assert_eq!(
        head(many.as_bytes()).finish_reasons().len(),
        MAX_FINISH_REASONS
    );
}

#[test]
fn a_stream_is_read_however_it_is_cut() {
    let bytes = STREAM.as_bytes();
    for split in 0..=bytes.len() {
        let (a, b) = bytes.split_at(split);
        let s = feed(&[a, b]);
        let g = s.grammar();
        let thinking = Usage {
            reasoning_tokens: 186,
            ..counted(5, 189, 4)
        };
        assert_eq!(g.usage(), Some(thinking), "split at {split}");
        assert!(g.finished() && g.ended(), "split at {split}");
        assert_eq!(g.finish_reasons().as_strs(), ["STOP"]);
        assert_eq!(s.events(), 3);
        let text = g.transcript().unwrap();
        assert_eq!(text.texts(), ["Hello there"], "thoughts left out");
    }
}

#[test]
fn the_stream_ends_with_its_last_candidate() {
    let event = |data: &str| format!("data: {data}\r\n\r\n");
    // Two candidates: the stream ends when both gave their reason.
    let mut s = SseStream::with_grammar(Events::default());
    s.feed(
        event(r#"{"candidates":[{"index":0,"finishReason":"STOP"},{"index":1}]}"#).as_bytes(),
        false,
        None,
    );
    assert!(s.grammar().finished() && !s.grammar().ended());
    s.feed(
        event(r#"{"candidates":[{"index":1,"finishReason":"MAX_TOKENS"}]}"#).as_bytes(),
        false,
        None,
    );
    assert!(s.grammar().ended());
    assert_eq!(
        s.grammar().finish_reasons().as_strs(),
        ["STOP", "MAX_TOKENS"]
    );
    // A blocked prompt: one event, no candidate, ended, not finished.
    let mut s = SseStream::with_grammar(Events::default());
    s.feed(
        event(
            r#"{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":7}}"#,
        )
        .as_bytes(),
        false,
        None,
    );
    let g = s.grammar();
    assert!(g.ended() && !g.finished());
    assert_eq!(g.finish_reasons().as_strs(), ["SAFETY"]);
    assert_eq!(g.usage().map(|u| u.prompt_tokens), Some(7));
    // An error in place of a response ends it.
    let mut s = SseStream::with_grammar(Events::default());
    s.feed(
        event(r#"{"candidates":[{"index":0}]}"#).as_bytes(),
        false,
        None,
    );
    assert!(!s.grammar().ended());
    s.feed(
        event(r#"{"error":{"code":503,"message":"overloaded","status":"UNAVAILABLE"}}"#).as_bytes(),
        false,
        None,
    );
    assert!(s.grammar().ended() && !s.grammar().finished());
    // Events that are not JSON, or not a response, change nothing.
    let mut s = SseStream::with_grammar(Events::default());
    s.feed(b"data: [DONE]\n\ndata: {\"candidates\":[{\"index\":99,\"finishReason\":\"STOP\"}]}\n\n: ping\n\n", false, None);
    let g = s.grammar();
    assert!(
        g.finished() && !g.ended(),
        "a candidate past the tracked ones is not waited for"
    );
    assert_eq!(g.usage(), None);
}

#[test]
fn a_collector_gets_each_event_parsed_once() {
    let mut g = Events::default();
    for (data, parse) in [
        (r#"{"candidates":[]}"#, true),
        ("not json", true),
        ("{}", false),
    ] {
        let event = Event {
            kind: None,
            data: Some(data.as_bytes()),
            oversize: false,
            end: None,
        };
        let r = g.read(&event, parse);
        assert!(!r.usage_only);
        match (parse, r.parsed) {
            (true, Parsed::Tree(t)) => assert_eq!(Some(t), serde_json::from_str(data).ok()),
            (true, Parsed::NotJson) => assert!(serde_json::from_str::<Value>(data).is_err()),
            (false, Parsed::Skipped) => {}
            (_, other) => panic!("{data}: {other:?}"),
        }
    }
}

#[test]
fn written_events_read_back() {
    let response = json!({"candidates": [{"content": {"parts": [{"text": "hi"}], "role": "model"},
        "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 1}});
    let mut out = Vec::new();
    write_event(&mut out, &response);
    assert!(out.starts_with(b"data: {") && out.ends_with(b"}\r\n\r\n"));
    let s = feed(&[&out]);
    assert_eq!(s.grammar().usage(), Some(counted(2, 1, 0)));
    assert!(s.grammar().ended());
}

#[test]
fn errors_are_in_googles_shape() {
    for (status, name) in [
        (400, "INVALID_ARGUMENT"),
        (401, "UNAUTHENTICATED"),
        (403, "PERMISSION_DENIED"),
        (404, "NOT_FOUND"),
        (408, "FAILED_PRECONDITION"),
        (429, "RESOURCE_EXHAUSTED"),
        (500, "INTERNAL"),
        (503, "UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
        (529, "INTERNAL"),
    ] {
        assert_eq!(status_name(status), name, "{status}");
        let body: Value = serde_json::from_slice(&error_body(status, "the \"message\"")).unwrap();
        assert_eq!(
            body,
            json!({"error": {"code": status, "message": "the \"message\"", "status": name}})
        );
    }
}

/// A Google 429 as the Gemini API and Vertex answer it: the message, and
/// a `google.rpc.QuotaFailure` naming each quota broken (`(quotaId,
/// quotaMetric, quotaValue)`), a `Help` and a `RetryInfo` as Google sends
/// them.
fn exhausted(message: &str, violations: &[(&str, &str, &str)]) -> Vec<u8> {
    let violations: Vec<Value> = violations
        .iter()
        .map(|(id, metric, value)| {
            json!({"quotaMetric": metric, "quotaId": id, "quotaValue": value,
                "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"}})
        })
        .collect();
    serde_json::to_vec(&json!({"error": {"code": 429, "message": message,
        "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": violations},
            {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description":
                "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "26s"}]}}))
    .unwrap()
}

const OVER: &str = "You exceeded your current quota, please check your plan and billing details.";
const REQUESTS: &str = "generativelanguage.googleapis.com/generate_content_free_tier_requests";
const TOKENS: &str =
    "generativelanguage.googleapis.com/generate_content_free_tier_input_token_count";

#[test]
fn error_classes_are_read_from_googles_errors_whatever_the_api() {
    use crate::dialect::answer::ErrorClass;
    use crate::routing::fallback::{classify, MAX_ERROR_BODY};
    let err = |code: u16, status: &str, message: &str| {
        serde_json::to_vec(&json!({"error": {"code": code, "message": message, "status": status}}))
            .unwrap()
    };
    let per_day = (
        "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
        REQUESTS,
        "250",
    );
    let per_minute = (
        "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
        REQUESTS,
        "10",
    );
    let tokens_per_minute = (
        "GenerateContentInputTokensPerModelPerMinute-FreeTier",
        TOKENS,
        "250000",
    );
    let none_of_it = (
        "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
        REQUESTS,
        "0",
    );
    // The Cloud APIs' form: the quota named in an ErrorInfo's metadata.
    let cloud = |limit: &str| {
        serde_json::to_vec(
            &json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
            "message": "Quota exceeded for quota metric 'Generate Content API requests' and limit.",
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "RATE_LIMIT_EXCEEDED", "domain": "googleapis.com",
                "metadata": {"quota_limit": limit, "quota_limit_value": "60"}}]}}),
        )
        .unwrap()
    };
    let listed = |one: &[u8]| {
        let mut out = b"[".to_vec();
        out.extend_from_slice(one);
        out.push(b']');
        out
    };
    for (status, body, want) in [
        (
            400,
            err(400, "INVALID_ARGUMENT", "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."),
            Some(ErrorClass::ContextLength),
        ),
        (
            400,
            err(400, "FAILED_PRECONDITION", "Gemini API free tier is not available in your country. Please enable billing on your project in Google AI Studio."),
            Some(ErrorClass::Quota),
        ),
        (
            429,
            err(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota: generate_content_free_tier_requests per day."),
            Some(ErrorClass::Quota),
        ),
        (
            404,
            err(404, "NOT_FOUND", "models/gemini-9 is not found for API version v1beta, or is not supported for generateContent."),
            Some(ErrorClass::ModelNotFound),
        ),
        // A day's quota spent, alone or among per-minute ones.
        (429, exhausted(OVER, &[per_day]), Some(ErrorClass::Quota)),
        (429, exhausted(OVER, &[per_minute, per_day, tokens_per_minute]), Some(ErrorClass::Quota)),
        (429, cloud("GenerateContentRequestsPerDayPerProjectPerRegion"), Some(ErrorClass::Quota)),
        // A quota of 0: the tier has none of the model, waiting gives none.
        (429, exhausted(OVER, &[none_of_it]), Some(ErrorClass::Quota)),
        // As Vertex's stream paths answer: a list of one error.
        (429, listed(&exhausted(OVER, &[per_day])), Some(ErrorClass::Quota)),
        // A minute's quota: failover's, whatever the message says.
        (429, exhausted(OVER, &[per_minute, tokens_per_minute]), None),
        (429, cloud("GenerateContentRequestsPerMinutePerProjectPerRegion"), None),
        (429, listed(&exhausted(OVER, &[per_minute])), None),
        (429, err(429, "RESOURCE_EXHAUSTED", OVER), None),
        (
            429,
            err(429, "RESOURCE_EXHAUSTED", "Resource exhausted. Please try again later."),
            None,
        ),
        // A per-day name elsewhere than a quota's is no quota's.
        (
            429,
            serde_json::to_vec(&json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
                "message": "Resource exhausted.", "details": [{"@type": "type.googleapis.com/google.rpc.Help",
                "links": [{"description": "Quotas per day", "url": "https://example.com/PerDay"}]}]}}))
            .unwrap(),
            None,
        ),
        (400, err(400, "INVALID_ARGUMENT", "Invalid JSON payload"), None),
        (503, err(503, "UNAVAILABLE", "The model is overloaded."), None),
        (404, err(404, "NOT_FOUND", "Requested entity was not found."), None),
        (400, b"{\"error\":\"x\"}".to_vec(), None),
        (400, b"not json".to_vec(), None),
        (400, vec![b' '; MAX_ERROR_BODY + 1], None),
    ] {
        let text = String::from_utf8_lossy(&body);
        // Vertex answers its own errors so for Claude and for its
        // OpenAI-compatible chat too.
        for api in [Dialect::Gemini, Dialect::Messages, Dialect::Chat] {
            assert_eq!(classify(api, status, &body, None), want, "{api:?} {text}");
        }
    }
}

#[test]
fn a_spent_quota_is_read_from_the_details_alone() {
    let error =
        |details: Value| json!({"code": 429, "status": "RESOURCE_EXHAUSTED", "details": details});
    for (details, want) in [
        (
            json!([{"violations": [{"quotaId": "RequestsPerDay"}]}]),
            true,
        ),
        (
            json!([{"violations": [{"quotaMetric": "x/requests_per_day"}]}]),
            true,
        ),
        (json!([{"violations": [{"quotaId": "DailyTokens"}]}]), true),
        (json!([{"violations": [{"quotaValue": 0}]}]), true),
        (
            json!([{"metadata": {"quota_limit": "RequestsPerDayPerProject"}}]),
            true,
        ),
        (
            json!([{"violations": [{"quotaId": "RequestsPerMinute", "quotaValue": "60"}]}]),
            false,
        ),
        (
            json!([{"violations": [{"quotaId": 7, "quotaValue": "00"}]}]),
            false,
        ),
        (
            json!([{"violations": "PerDay"}, "PerDay", {"metadata": "PerDay"}]),
            false,
        ),
        (json!({"violations": [{"quotaId": "PerDay"}]}), false),
        (json!([]), false),
    ] {
        assert_eq!(quota_spent(&error(details.clone())), want, "{details}");
    }
    assert!(!quota_spent(&json!("PerDay")));
}

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    /// Paths near the grammar: its own pieces in any order, and any char.
    fn path() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "/",
            "v1beta",
            "v1",
            "models",
            ":",
            "generateContent",
            "streamGenerateContent",
            "?",
            "alt=sse",
            "&",
            "#",
            "gemini-2.5-flash",
            "é",
            "%2F",
            " ",
            "@",
        ]);
        prop::collection::vec(
            prop_oneof![4 => piece.prop_map(str::to_string), 1 => any::<char>().prop_map(String::from)],
            0..16,
        )
        .prop_map(|pieces| pieces.concat())
    }

    /// `v` as a document of the fuzz module's, to be spelled many ways.
    fn doc_of(v: &Value) -> fuzz::Doc {
        match v {
            Value::Null => fuzz::Doc::Null,
            Value::Bool(b) => fuzz::Doc::Bool(*b),
            Value::Number(n) => {
                let mut digits = n.as_u64().unwrap().to_string();
                let mut exp = 0;
                while digits.ends_with('0') {
                    digits.pop();
                    exp += 1;
                }
                if digits.is_empty() {
                    exp = 0;
                }
                fuzz::Doc::Num(fuzz::Num {
                    negative: false,
                    digits,
                    exp,
                })
            }
            Value::String(s) => fuzz::Doc::Str(s.clone()),
            Value::Array(items) => fuzz::Doc::Arr(items.iter().map(doc_of).collect()),
            Value::Object(members) => fuzz::Doc::Obj(
                members
                    .iter()
                    .map(|(k, v)| (k.clone(), doc_of(v)))
                    .collect(),
            ),
        }
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// A Google quota error, however it is spelled (whitespace,
        /// member order, number spelling, string escapes), reads as the
        /// same class in every API: a day's quota spent, a minute's not.
        #[test]
        fn any_spelling_of_a_quota_error_reads_alike(seed: u64, daily: bool, at in 0usize..3) {
            use crate::dialect::answer::ErrorClass;
            use crate::routing::fallback::classify;
            let minute = ("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", REQUESTS, "10");
            let day = ("GenerateRequestsPerDayPerProjectPerModel-FreeTier", REQUESTS, "250");
            let mut violations = vec![minute, minute];
            if daily {
                violations.insert(at, day);
            }
            let body: Value = serde_json::from_slice(&exhausted(OVER, &violations)).unwrap();
            let spelled = doc_of(&body).spell(seed);
            let want = daily.then_some(ErrorClass::Quota);
            for api in [Dialect::Gemini, Dialect::Messages, Dialect::Chat] {
                prop_assert_eq!(classify(api, 429, spelled.as_bytes(), None), want, "{}", spelled);
            }
        }

        /// Any path reads without panic; a call's model rewrites to any
        /// model name and reads back, the rest of the call the same.
        #[test]
        fn any_path_reads_and_rewrites(path in path(), model in "[a-z0-9.@_-]{1,12}") {
            if let Some(call) = call_of(&path) {
                let new = with_model(&path, &model).expect("a call's model rewrites");
                let again = call_of(&new).expect("still a call");
                prop_assert_eq!(again.model, model.as_str());
                prop_assert_eq!((again.version, again.stream, again.sse), (call.version, call.stream, call.sse));
                prop_assert_eq!(with_model(&new, call.model), Some(path.clone()));
            } else {
                prop_assert_eq!(with_model(&path, &model), None);
            }
        }

        /// A path without its key has no key left, and the rest of the
        /// call the same.
        #[test]
        fn a_key_taken_out_is_gone(path in path(), key in "[A-Za-z0-9_-]{1,8}", at in 0usize..3) {
            let mut with = path.clone();
            let sep = if with.contains('?') { "&" } else { "?" };
            let param = format!("key={key}");
            match at {
                0 => with.push_str(&format!("{sep}{param}")),
                _ => with = with.replacen('?', &format!("?{param}&"), 1),
            }
            if let Some(without) = without_query_key(&with) {
                prop_assert_eq!(query_key(&without), None);
                prop_assert_eq!(call_of(&without).map(|c| (c.model, c.stream)), call_of(&with).map(|c| (c.model, c.stream)));
            }
        }

        /// Any bytes, cut anywhere, read as a stream without panic, and
        /// the same however they are cut.
        #[test]
        fn any_stream_reads_alike_however_cut(
            doc in fuzz::doc(false),
            seed: u64,
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = b"data: ".to_vec();
            bytes.extend_from_slice(&fuzz::mutated(&doc, seed));
            bytes.extend_from_slice(b"\r\n\r\n");
            bytes.extend_from_slice(STREAM.as_bytes());
            let at = cut.index(bytes.len() + 1);
            let (a, b) = bytes.split_at(at);
            let whole = feed(&[&bytes]);
            let cut = feed(&[a, b]);
            let (w, c) = (whole.grammar(), cut.grammar());
            prop_assert_eq!(w.usage(), c.usage());
            prop_assert_eq!((w.ended(), w.finished(), whole.events()), (c.ended(), c.finished(), cut.events()));
            prop_assert_eq!(w.transcript(), c.transcript());
        }

        /// Any body: the answer, the prompt, the cap and the error class
        /// read without panic, and a cap that is set reads back.
        #[test]
        fn any_body_reads_and_caps(doc in fuzz::doc(false), seed: u64, cap in 0u64..5000) {
            let bytes = fuzz::mutated(&doc, seed);
            let _ = Dialect::Gemini.answer().head(&bytes);
            let _ = crate::routing::fallback::classify(Dialect::Gemini, 429, &bytes, None);
            let mut doc = Document::parse(bytes.clone());
            if let Some(tree) = doc.tree() {
                let _ = texts(tree).count();
                if let Json::Array(items) = tree {
                    if let Some(t) = turns(items) {
                        prop_assert_eq!(t.starts.len(), items.len());
                        prop_assert!(t.starts.get(t.current) == Some(&true));
                    }
                }
                let _ = (output_cap(tree), temperature(tree));
            }
            if cap_output(&mut doc, cap) {
                let tree = Json::parse(doc.bytes()).expect("still JSON");
                prop_assert_eq!(output_cap(&tree), Some(cap));
                prop_assert_eq!(doc.tree().and_then(output_cap), Some(cap));
            } else {
                prop_assert_eq!(doc.bytes(), &bytes[..]);
            }
        }

        /// A `usageMetadata` of any counts reads without overflow.
        #[test]
        fn any_counts_read(p: u64, c: u64, cached: u64, t: u64, tool: u64) {
            let m = json!({"promptTokenCount": p, "candidatesTokenCount": c,
                "cachedContentTokenCount": cached, "thoughtsTokenCount": t, "toolUsePromptTokenCount": tool});
            let u = usage(&m).expect("a usage");
            prop_assert_eq!(u.prompt_tokens, p.saturating_add(tool));
            prop_assert_eq!(u.completion_tokens, c.saturating_add(t));
            prop_assert_eq!(u.cached_tokens, cached);
        }
    }
}

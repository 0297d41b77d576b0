use serde_json::Value;

use crate::dialect::Dialect;
use crate::usage::{Head, Usage, MAX_FINISH_REASONS};

fn every() -> Vec<Dialect> {
    Dialect::names().filter_map(Dialect::named).collect()
}

/// The head of a JSON answer body of `dialect`.
fn head(dialect: Dialect, body: &[u8]) -> Head {
    dialect.answer().head(body)
}

/// The usage of a JSON answer body of `dialect`.
fn of(dialect: Dialect, body: &[u8]) -> Option<Usage> {
    head(dialect, body).usage
}

/// The usage a path of another shape reads, which takes every dialect's
/// names (Gemini's aside).
fn from_json(body: &[u8]) -> Option<Usage> {
    of(Dialect::Other, body)
}

fn want(p: u64, c: u64, cached: u64) -> Option<Usage> {
    Some(Usage {
        prompt_tokens: p,
        completion_tokens: c,
        cached_tokens: cached,
        ..Usage::default()
    })
}

#[test]
fn finish_reasons_of_each_dialect() {
    let reasons = |d: Dialect, body: &str| {
        head(d, body.as_bytes())
            .finish_reasons()
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
    };
    let chat = r#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":"x"}},{"finish_reason":"length"},{}]}"#;
    for d in [
        Dialect::Chat,
        Dialect::Completions,
        Dialect::Embeddings,
        Dialect::Other,
    ] {
        assert_eq!(reasons(d, chat), ["stop", "length"], "{d:?}");
    }
    let messages = r#"{"type":"message","stop_reason":"end_turn","content":[]}"#;
    assert_eq!(reasons(Dialect::Messages, messages), ["end_turn"]);
    assert_eq!(reasons(Dialect::Other, messages), ["end_turn"]);
    let done = r#"{"object":"response","status":"completed","incomplete_details":null}"#;
    assert_eq!(reasons(Dialect::Responses, done), ["completed"]);
    assert_eq!(reasons(Dialect::Other, done), ["completed"]);
    let cut = r#"{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}"#;
    assert_eq!(reasons(Dialect::Responses, cut), ["max_output_tokens"]);
    // Each dialect reads its own words only.
    assert!(reasons(Dialect::Chat, messages).is_empty());
    assert!(reasons(Dialect::Messages, chat).is_empty());
    assert!(reasons(Dialect::Chat, done).is_empty());
    // Another answer's `status` is not a finish reason, and never costs
    // the usage beside it.
    let other = br#"{"status":400,"usage":{"prompt_tokens":3}}"#;
    for d in [Dialect::Other, Dialect::Responses] {
        assert!(head(d, other).finish_reasons().is_empty(), "{d:?}");
    }
    assert_eq!(from_json(other).map(|u| u.prompt_tokens), Some(3));
    assert!(head(Dialect::Other, br#"{"output":[]}"#)
        .finish_reasons()
        .is_empty());
    let many = format!(
        r#"{{"choices":[{}]}}"#,
        vec![r#"{"finish_reason":"stop"}"#; 20].join(",")
    );
    assert_eq!(
        head(Dialect::Chat, many.as_bytes()).finish_reasons().len(),
        MAX_FINISH_REASONS
    );
}

#[test]
fn reads_json_usage_id_and_model() {
    let body = br#"{"id":"x","model":"m","usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;
    for d in [Dialect::Chat, Dialect::Other] {
        let h = head(d, body);
        assert_eq!(h.usage, want(12, 5, 0), "{d:?}");
        assert_eq!(
            (h.id.as_deref(), h.model.as_deref()),
            (Some("x"), Some("m"))
        );
    }
    assert_eq!(
        from_json(br#"{"usage":{"prompt_tokens":3,"total_tokens":3}}"#),
        want(3, 0, 0)
    );
    // An embeddings answer's vectors are read past.
    let vectors = br#"{"object":"list","data":[{"embedding":[0.1,-2e-3,[[]]]}],"model":"e","usage":{"prompt_tokens":4,"total_tokens":4}}"#;
    let h = head(Dialect::Embeddings, vectors);
    assert_eq!((h.usage, h.model.as_deref()), (want(4, 0, 0), Some("e")));
    for junk in [&br#"{"usage":null}"#[..], b"{", b"", b"[1]", b"{} x"] {
        assert_eq!(from_json(junk), None, "{junk:?}");
    }
    // Of a name given twice, the last counts (as a parsed tree keeps it).
    let twice = br#"{"usage":{"prompt_tokens":1},"id":"a","usage":{"prompt_tokens":2}}"#;
    assert_eq!(of(Dialect::Chat, twice), want(2, 0, 0));
}

#[test]
fn reads_each_dialects_usage() {
    // Each in its own dialect, and as a path of another shape reads it.
    let u = |d: Dialect, s: &str| {
        assert_eq!(of(d, s.as_bytes()), from_json(s.as_bytes()), "{s}");
        of(d, s.as_bytes())
    };
    assert_eq!(
        u(
            Dialect::Chat,
            r#"{"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#
        ),
        want(10, 2, 8)
    );
    assert_eq!(
        u(
            Dialect::Responses,
            r#"{"object":"response","usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":13}}"#
        ),
        want(10, 3, 4).map(|w| Usage {
            reasoning_tokens: 1,
            ..w
        })
    );
    assert_eq!(
        u(
            Dialect::Chat,
            r#"{"usage":{"prompt_tokens":9,"completion_tokens":7,"completion_tokens_details":{"reasoning_tokens":5}}}"#
        ),
        want(9, 7, 0).map(|w| Usage {
            reasoning_tokens: 5,
            ..w
        })
    );
    assert_eq!(
        u(
            Dialect::Messages,
            r#"{"type":"message","usage":{"input_tokens":2,"cache_read_input_tokens":7,"cache_creation_input_tokens":1,"output_tokens":5}}"#
        ),
        want(10, 5, 7).map(|w| Usage {
            cache_write_tokens: 1,
            ..w
        })
    );
    // The writes split by how long they are kept, as Anthropic reports them.
    let split = r#"{"type":"message","usage":{"input_tokens":2,"cache_read_input_tokens":7,"cache_creation_input_tokens":30,"cache_creation":{"ephemeral_5m_input_tokens":10,"ephemeral_1h_input_tokens":20},"output_tokens":5}}"#;
    assert_eq!(
        of(Dialect::Messages, split.as_bytes()),
        want(39, 5, 7).map(|w| Usage {
            cache_write_tokens: 30,
            cache_write_1h_tokens: 20,
            ..w
        })
    );
    // A breakdown alone still counts its writes; one of another type costs
    // the usage, as any count of another type does.
    let breakdown =
        r#"{"usage":{"input_tokens":1,"cache_creation":{"ephemeral_1h_input_tokens":4}}}"#;
    assert_eq!(
        of(Dialect::Messages, breakdown.as_bytes()),
        want(5, 0, 0).map(|w| Usage {
            cache_write_tokens: 4,
            cache_write_1h_tokens: 4,
            ..w
        })
    );
    let odd = r#"{"usage":{"input_tokens":1,"cache_creation":3}}"#;
    assert_eq!(of(Dialect::Messages, odd.as_bytes()), None);
    assert_eq!(
        u(
            Dialect::Messages,
            r#"{"usage":{"input_tokens":2,"cache_read_input_tokens":null,"output_tokens":5}}"#
        ),
        want(2, 5, 0)
    );
}

/// What each dialect's answers read as, odd ones included: a count of its
/// names that is null, a string, negative, fractional or past `u64` costs
/// the whole head; a missing count is 0; null or missing details are no
/// cached tokens; Anthropic's cache counts add to the input, saturating.
#[test]
fn pins_what_each_dialects_usage_reads_as() {
    let max = u64::MAX;
    let big = format!(
        r#"{{"usage":{{"input_tokens":{max},"cache_read_input_tokens":5,"output_tokens":1}}}}"#
    );
    let past = r#"{"usage":{"prompt_tokens":18446744073709551616}}"#;
    let openai = [Dialect::Chat, Dialect::Completions, Dialect::Embeddings];
    let all = [
        Dialect::Chat,
        Dialect::Completions,
        Dialect::Embeddings,
        Dialect::Responses,
        Dialect::Messages,
    ];
    let (responses, messages) = ([Dialect::Responses], [Dialect::Messages]);
    let anthropic_named = [Dialect::Responses, Dialect::Messages];
    let cases: [(&[Dialect], &str, Option<Usage>); 19] = [
        (&all, r#"{"usage":{}}"#, want(0, 0, 0)),
        (
            &openai,
            r#"{"usage":{"completion_tokens":4}}"#,
            want(0, 4, 0),
        ),
        (&openai, r#"{"usage":{"prompt_tokens":null}}"#, None),
        (&openai, r#"{"usage":{"prompt_tokens":"3"}}"#, None),
        (&openai, r#"{"usage":{"prompt_tokens":-1}}"#, None),
        (&openai, r#"{"usage":{"prompt_tokens":1.5}}"#, None),
        (&openai, r#"{"usage":{"prompt_tokens":3.0}}"#, None),
        (&openai, past, None),
        (&all, r#"{"usage":"many"}"#, None),
        (
            &openai,
            r#"{"usage":{"prompt_tokens":2,"prompt_tokens_details":null}}"#,
            want(2, 0, 0),
        ),
        (
            &openai,
            r#"{"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":null}}}"#,
            want(2, 0, 0),
        ),
        (
            &openai,
            r#"{"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":"1"}}}"#,
            None,
        ),
        (
            &openai,
            r#"{"usage":{"prompt_tokens":2,"prompt_tokens_details":{"audio_tokens":1}}}"#,
            want(2, 0, 0),
        ),
        (
            &responses,
            r#"{"usage":{"input_tokens":2,"input_tokens_details":null,"output_tokens":1}}"#,
            want(2, 1, 0),
        ),
        (&anthropic_named, r#"{"usage":{"input_tokens":null}}"#, None),
        (
            &messages,
            r#"{"usage":{"input_tokens":2,"cache_creation_input_tokens":null,"output_tokens":1}}"#,
            want(2, 1, 0),
        ),
        (
            &messages,
            r#"{"usage":{"input_tokens":2,"cache_creation_input_tokens":"3"}}"#,
            None,
        ),
        (&messages, big.as_str(), want(max, 1, 5)),
        (&responses, big.as_str(), want(max, 1, 0)),
    ];
    for (dialects, body, usage) in cases {
        for d in dialects {
            assert_eq!(of(*d, body.as_bytes()), usage, "{d:?} {body}");
        }
        if dialects != [Dialect::Responses] {
            assert_eq!(from_json(body.as_bytes()), usage, "{body}");
        }
    }
    // A count that costs the usage costs the id and model beside it.
    let h = head(
        Dialect::Chat,
        br#"{"id":"a","model":"m","usage":{"prompt_tokens":"3"}}"#,
    );
    assert_eq!(h, Head::default());
    // So does an id, a model or a reason of another type.
    for body in [
        r#"{"id":5,"usage":{"prompt_tokens":3}}"#,
        r#"{"model":[],"usage":{"prompt_tokens":3}}"#,
        r#"{"choices":[{"finish_reason":1}],"usage":{"prompt_tokens":3}}"#,
    ] {
        assert_eq!(
            head(Dialect::Chat, body.as_bytes()),
            Head::default(),
            "{body}"
        );
    }
}

/// Each dialect counts its own names only, and a name of another dialect,
/// whatever it holds, never costs its usage; a path of another shape
/// counts every dialect's.
#[test]
fn a_dialect_counts_its_own_names() {
    let chat_named = br#"{"usage":{"prompt_tokens":4,"completion_tokens":2}}"#;
    let anthropic_named =
        br#"{"usage":{"input_tokens":4,"cache_read_input_tokens":3,"output_tokens":2}}"#;
    assert_eq!(of(Dialect::Chat, chat_named), want(4, 2, 0));
    assert_eq!(of(Dialect::Messages, chat_named), want(0, 0, 0));
    assert_eq!(of(Dialect::Responses, chat_named), want(0, 0, 0));
    assert_eq!(of(Dialect::Chat, anthropic_named), want(0, 0, 0));
    assert_eq!(of(Dialect::Responses, anthropic_named), want(4, 2, 0));
    assert_eq!(of(Dialect::Messages, anthropic_named), want(7, 2, 3));
    assert_eq!(from_json(chat_named), want(4, 2, 0));
    assert_eq!(from_json(anthropic_named), want(7, 2, 3));
    let both = br#"{"usage":{"prompt_tokens":4,"input_tokens":5}}"#;
    assert_eq!(of(Dialect::Chat, both), want(4, 0, 0));
    assert_eq!(of(Dialect::Messages, both), want(5, 0, 0));
    let foreign = br#"{"usage":{"prompt_tokens":4,"input_tokens":null,"cache_read_input_tokens":"x"},"stop_reason":7,"candidates":1}"#;
    assert_eq!(of(Dialect::Chat, foreign), want(4, 0, 0));
    assert_eq!(from_json(foreign), None);
    // Gemini's usage is in `usageMetadata`; no other dialect reads it.
    let gemini = br#"{"usageMetadata":{"promptTokenCount":3},"usage":{"prompt_tokens":9}}"#;
    assert_eq!(of(Dialect::Gemini, gemini), want(3, 0, 0));
    assert_eq!(of(Dialect::Chat, gemini), want(9, 0, 0));
}

#[test]
fn a_gemini_answer_is_read_from_usage_metadata_and_candidates() {
    let body = br#"{"candidates":[{"content":{"parts":[{"text":"x"}]},"finishReason":"STOP"},{"finishReason":"MAX_TOKENS"}],
        "usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":4,"cachedContentTokenCount":6,"thoughtsTokenCount":2},
        "responseId":"r","modelVersion":"g"}"#;
    let h = head(Dialect::Gemini, body);
    assert_eq!(
        h.usage,
        want(10, 6, 6).map(|w| Usage {
            reasoning_tokens: 2,
            ..w
        })
    );
    assert_eq!(h.finish_reasons(), ["STOP", "MAX_TOKENS"]);
    assert_eq!((h.id, h.model), (None, None));
    // Another dialect reads no usage there; a path of another shape reads
    // the candidates' reasons all the same.
    assert_eq!(from_json(body), None);
    assert_eq!(
        head(Dialect::Other, body).finish_reasons(),
        ["STOP", "MAX_TOKENS"]
    );
    assert!(head(Dialect::Chat, body).finish_reasons().is_empty());
    // Metadata it cannot read is no usage; the reasons stay.
    let odd =
        br#"{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":"3"}}"#;
    let h = head(Dialect::Gemini, odd);
    assert_eq!((h.usage, h.finish_reasons()), (None, vec!["STOP"]));
    // A candidate's reason of another type costs the head.
    let bad = br#"{"candidates":[{"finishReason":1}],"usageMetadata":{"promptTokenCount":3}}"#;
    assert_eq!(head(Dialect::Gemini, bad), Head::default());
}

#[test]
fn a_stream_events_usage_is_read_by_the_same_names() {
    let usage: Value =
        serde_json::from_str(r#"{"prompt_tokens":2,"input_tokens":3,"output_tokens":1}"#).unwrap();
    let read = |d: Dialect| d.answer().usage(&usage);
    assert_eq!(read(Dialect::Chat), want(2, 0, 0));
    assert_eq!(read(Dialect::Responses), want(3, 1, 0));
    assert_eq!(read(Dialect::Messages), want(3, 1, 0));
    assert_eq!(read(Dialect::Other), want(5, 1, 0));
    assert_eq!(read(Dialect::Gemini), want(0, 0, 0));
    for d in every() {
        assert_eq!(d.answer().usage(&Value::Null), None, "{d:?}");
        assert_eq!(d.answer().usage(&serde_json::json!([1])), None, "{d:?}");
    }
}

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    proptest! {
        #![proptest_config(fuzz::config(128))]

        /// Every dialect reads an answer's head alike from its bytes and
        /// from the same answer written anew from its parsed tree (other
        /// spacing, order and escapes), and keeps a bounded number of
        /// reasons; no body makes it panic.
        #[test]
        fn any_body_reads_alike(doc in fuzz::doc(false), seed: u64) {
            let body = fuzz::mutated(&doc, seed);
            let tree = serde_json::from_slice::<Value>(&body).ok();
            for d in every() {
                let read = head(d, &body);
                prop_assert!(read.finish_reasons().len() <= MAX_FINISH_REASONS);
                if let Some(tree) = &tree {
                    let again = serde_json::to_vec(tree).unwrap();
                    prop_assert_eq!(&head(d, &again), &read, "{:?}", d);
                }
            }
        }

        /// An answer whose usage is any JSON reads its head from its members
        /// as the dialect's usage reader reads that value.
        #[test]
        fn a_heads_usage_is_the_readers(doc in fuzz::doc(false), seed: u64) {
            let body = fuzz::mutated(&doc, seed);
            if let Ok(usage) = serde_json::from_slice::<Value>(&body) {
                let answer = serde_json::to_vec(&serde_json::json!({ "usage": usage })).unwrap();
                for d in every().into_iter().filter(|d| *d != Dialect::Gemini) {
                    let read = d.answer().usage(&usage);
                    let want = if usage.is_null() { None } else { read };
                    prop_assert_eq!(head(d, &answer).usage, want, "{:?}", d);
                }
            }
        }
    }
}

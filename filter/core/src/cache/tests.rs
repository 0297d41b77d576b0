//! Round trips between the answer's forms and a whole cached call walked
//! through the core, plus a scriptable store for race tests.

use std::cell::{Cell, RefCell};

use serde_json::{json, Value};

use super::assemble::Fed;
use super::*;
use crate::dialect::Dialect;
use crate::host::{MemoryStore, SharedStore, StoreError, Versioned};
use crate::json::Json;

pub(crate) const STAMP: Stamp = Stamp {
    stored_at_ms: 1_000,
    expires_at_ms: 61_000,
};

type Hook = Box<dyn FnOnce(&MemoryStore)>;

/// A [`MemoryStore`] whose calls can be interleaved with scripted writes, to
/// play the other worker in a race.
#[derive(Default)]
pub(crate) struct HookStore {
    pub(crate) inner: MemoryStore,
    calls: Cell<usize>,
    /// Runs before call number `n` (0-based, gets and sets counted together).
    hooks: RefCell<Vec<(usize, Hook)>>,
    /// Every set fails with this error.
    pub(crate) fail_sets: Cell<Option<StoreError>>,
}

impl HookStore {
    pub(crate) fn before_call(&self, n: usize, hook: impl FnOnce(&MemoryStore) + 'static) {
        self.hooks.borrow_mut().push((n, Box::new(hook)));
    }

    /// Calls made so far: the number the next call gets.
    pub(crate) fn calls(&self) -> usize {
        self.calls.get()
    }

    fn tick(&self) {
        let n = self.calls.get();
        self.calls.set(n + 1);
        let due: Vec<Hook> = {
            let mut hooks = self.hooks.borrow_mut();
            let (due, rest): (Vec<_>, Vec<_>) = hooks.drain(..).partition(|(at, _)| *at == n);
            *hooks = rest;
            due.into_iter().map(|(_, h)| h).collect()
        };
        for h in due {
            h(&self.inner);
        }
    }
}

impl SharedStore for HookStore {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        self.tick();
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        self.tick();
        if let Some(e) = self.fail_sets.get() {
            return Err(e);
        }
        self.inner.set(key, value, cas)
    }
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// JSON → entry → SSE → assembler (split at every byte) → entry → JSON.
fn round_trip(dialect: Dialect, answer: &Value) {
    let body = serde_json::to_vec(answer).unwrap();
    let entry = Entry::from_json(dialect, 200, &body, STAMP, 1 << 20).unwrap();
    let sse = entry.reply(true, true).unwrap();
    assert_eq!(sse.content_type, entry::SSE_CONTENT_TYPE);
    for split in 0..=sse.body.len() {
        let (a, b) = sse.body.split_at(split);
        let mut asm = Fed::new(dialect, 1 << 20).unwrap();
        asm.feed(a);
        asm.feed(b);
        let again = asm
            .finish(STAMP)
            .unwrap_or_else(|e| panic!("split at {split}: {e:?}"));
        assert_eq!(json_of(again.body()), *answer, "split at {split}");
        assert_eq!(again.model(), entry.model());
        let plain = again.reply(false, false).unwrap();
        assert_eq!(plain.content_type, entry::JSON_CONTENT_TYPE);
        assert_eq!(json_of(&plain.body), *answer);
    }
}

fn chat_answer(choices: Value) -> Value {
    json!({
        "id": "chatcmpl-AbC",
        "object": "chat.completion",
        "created": 1_726_000_000,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_abc",
        "service_tier": "default",
        "choices": choices,
        "usage": {"prompt_tokens": 19, "completion_tokens": 40, "total_tokens": 59,
                  "prompt_tokens_details": {"cached_tokens": 0}},
    })
}

#[test]
fn chat_text_round_trips() {
    round_trip(
        Dialect::Chat,
        &chat_answer(json!([{
            "index": 0,
            "message": {"role": "assistant",
                        "content": "Paris is the capital of France. It has been since 987 — \"quoted\" and émoji 😀.\nNew line.",
                        "refusal": null, "annotations": []},
            "logprobs": null,
            "finish_reason": "stop",
        }])),
    );
}

#[test]
fn chat_tool_calls_and_many_choices_round_trip() {
    round_trip(
        Dialect::Chat,
        &chat_answer(json!([
            {
                "index": 0,
                "message": {"role": "assistant", "content": null, "refusal": null,
                            "tool_calls": [
                                {"id": "call_1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"celsius\",\"days\":3}"}},
                                {"id": "call_2", "type": "function",
                                 "function": {"name": "get_time", "arguments": "{}"}},
                            ]},
                "logprobs": null,
                "finish_reason": "tool_calls",
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "", "refusal": "I can't help with that request, sorry."},
                "logprobs": null,
                "finish_reason": "stop",
            },
            {
                "index": 2,
                "message": {"role": "assistant", "content": "Thinking done.",
                            "reasoning_content": "First, consider the question carefully. Then answer it."},
                "logprobs": null,
                "finish_reason": "length",
            },
        ])),
    );
}

#[test]
fn chat_logprobs_round_trip() {
    round_trip(
        Dialect::Chat,
        &chat_answer(json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world, how are you today?", "refusal": null},
            "logprobs": {"content": [
                {"token": "Hello", "logprob": -0.1, "bytes": [72, 101, 108, 108, 111], "top_logprobs": []},
                {"token": " world", "logprob": -0.25, "bytes": null, "top_logprobs": []},
            ], "refusal": null},
            "finish_reason": "stop",
        }])),
    );
}

/// serde_json's fast float reading is one ULP off for some values; the cache
/// reads floats exactly (`float_roundtrip`), so a replayed number is the
/// stored one to the last bit.
#[test]
fn logprobs_keep_every_bit() {
    round_trip(
        Dialect::Chat,
        &chat_answer(json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "x", "refusal": null},
            "logprobs": {"content": [
                {"token": "x", "logprob": -15.334990252595015, "bytes": null, "top_logprobs": []},
            ], "refusal": null},
            "finish_reason": "stop",
        }])),
    );
}

#[test]
fn text_completion_round_trips() {
    let answer = json!({
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "gpt-3.5-turbo-instruct",
        "choices": [
            {"text": "\n\nThis is indeed a test of the completions endpoint, long enough to split.",
             "index": 0, "logprobs": null, "finish_reason": "length"},
            {"text": "", "index": 1, "logprobs": null, "finish_reason": "stop"},
            {"text": " yes", "index": 2,
             "logprobs": {"tokens": [" yes"], "token_logprobs": [-0.5], "top_logprobs": [{" yes": -0.5}], "text_offset": [3]},
             "finish_reason": "stop"},
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    });
    round_trip(Dialect::Completions, &answer);
}

/// A stream as OpenAI sends it: role chunk, `usage: null` and `obfuscation`
/// padding on every chunk, tool call arguments in pieces, a usage chunk.
const UPSTREAM: &str = concat!(
    ": keep-alive\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"system_fingerprint\":\"fp\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"x1\"}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"system_fingerprint\":\"fp\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"x2\"}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"system_fingerprint\":\"fp\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"lo\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_9\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\r\n\r\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"type\":\"function\",\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data:{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],\"usage\":null}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\n",
    "data: [DONE]\n\n",
);

#[test]
fn assembles_a_provider_stream_split_anywhere() {
    let want = json!({
        "id": "c1", "object": "chat.completion", "created": 7, "model": "m", "system_fingerprint": "fp",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello", "refusal": null,
                     "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                     "logprobs": null, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    });
    let bytes = UPSTREAM.as_bytes();
    for split in 0..=bytes.len() {
        let mut asm = Fed::new(Dialect::Chat, 4096).unwrap();
        asm.feed(&bytes[..split]);
        asm.feed(&bytes[split..]);
        let e = asm.finish(STAMP).unwrap();
        assert_eq!(json_of(e.body()), want, "split at {split}");
        assert_eq!(e.model(), "m");
    }
    // Byte by byte, too.
    let mut asm = Fed::new(Dialect::Chat, 4096).unwrap();
    for b in bytes {
        asm.feed(std::slice::from_ref(b));
    }
    assert_eq!(json_of(asm.finish(STAMP).unwrap().body()), want);
}

#[test]
fn only_complete_streams_make_entries() {
    let assemble = |s: &str, limit: u32| {
        let mut asm = Fed::new(Dialect::Chat, limit).unwrap();
        asm.feed(s.as_bytes());
        asm.finish(STAMP)
    };
    let without_done = UPSTREAM.replace("data: [DONE]\n\n", "");
    assert_eq!(assemble(&without_done, 4096), Err(EntryError::Incomplete));
    let unfinished = UPSTREAM.replace("\"finish_reason\":\"tool_calls\"", "\"finish_reason\":null");
    assert_eq!(assemble(&unfinished, 4096), Err(EntryError::Incomplete));
    let error = UPSTREAM.replace(
        "data: [DONE]",
        "data: {\"error\":{\"message\":\"overloaded\"}}\n\ndata: [DONE]",
    );
    assert_eq!(assemble(&error, 4096), Err(EntryError::Incomplete));
    let garbage = UPSTREAM.replace("data: [DONE]", "data: {nope\n\ndata: [DONE]");
    assert_eq!(assemble(&garbage, 4096), Err(EntryError::Incomplete));
    assert_eq!(
        assemble("data: [DONE]\n\n", 4096),
        Err(EntryError::Incomplete)
    );
    assert_eq!(assemble(UPSTREAM, 200), Err(EntryError::TooLarge));
    // No trailing blank line after [DONE] still ends the stream.
    assert!(assemble(UPSTREAM.trim_end(), 4096).is_ok());
    assert!(StreamAssembler::new(Dialect::Embeddings, 4096).is_none());
    assert!(StreamAssembler::new(Dialect::Other, 4096).is_none());
}

#[test]
fn a_cached_stream_is_parsed_once_for_usage_strip_and_entry() {
    let bytes = UPSTREAM.as_bytes();
    let json_events = UPSTREAM.matches("data:").count() - 1;
    for size in [1, 7, bytes.len()] {
        let mut stream: crate::sse::Stream<crate::dialect::chat::stream::Chat> =
            crate::sse::Stream::new();
        stream.strip_usage();
        let mut asm = StreamAssembler::new(Dialect::Chat, 4096).unwrap();
        let before = crate::dialect::chat::stream::tests::parses();
        let mut out = Vec::new();
        for piece in bytes.chunks(size) {
            let passed = stream.feed(piece, false, Some(&mut asm));
            out.extend(passed.unwrap_or_else(|| piece.to_vec()));
        }
        out.extend(stream.feed(&[], true, Some(&mut asm)).unwrap_or_default());
        assert_eq!(
            crate::dialect::chat::stream::tests::parses() - before,
            json_events as u64
        );
        let usage_chunk = UPSTREAM
            .split_inclusive("\n\n")
            .find(|e| e.contains("\"choices\":[]"))
            .unwrap();
        assert_eq!(out, UPSTREAM.replace(usage_chunk, "").as_bytes());
        assert_eq!(stream.usage().map(|u| u.completion_tokens), Some(4));
        let entry = asm.finish(STAMP).unwrap();
        assert_eq!(json_of(entry.body())["usage"]["total_tokens"], 7);
    }
}

#[test]
fn a_long_stream_gives_up_with_bounded_memory() {
    let mut asm = Fed::new(Dialect::Chat, 2048).unwrap();
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"0123456789\"}}]}\n\n";
    for _ in 0..1000 {
        asm.feed(chunk.as_bytes());
    }
    assert!(asm.gave_up());
    assert_eq!(asm.finish(STAMP), Err(EntryError::TooLarge));
    // One endless line.
    let mut asm = Fed::new(Dialect::Chat, 2048).unwrap();
    asm.feed(b"data: ");
    for _ in 0..1000 {
        asm.feed(b"xxxxxxxxxx");
    }
    assert!(asm.gave_up());
}

#[test]
fn a_whole_cached_call_through_the_core() {
    let cfg = CacheConfig::default();
    let shared = MemoryStore::new();
    let store = Store::new(&shared, &cfg);
    let body = br#"{"model":"m","temperature":0,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let creds = [Some("Bearer t1"), None];
    let tree = Json::parse(body);
    let req = CacheRequest {
        dialect: Dialect::Chat,
        path: "/v1/chat/completions",
        body: tree.as_ref(),
        cache_control: None,
        credentials: &creds,
    };
    let Decision::Cacheable(Cacheable {
        key,
        stream: true,
        include_usage: true,
        read: true,
        store: true,
        max_age_ms: None,
    }) = decide(&cfg, &req)
    else {
        panic!("not cacheable");
    };
    let now = 10_000;
    assert_eq!(store.lookup(&key, now), Lookup::Miss);
    let Claim::Leader(lease) = coalesce::claim(&store, &key, now, cfg.coalesce_wait_ms, 1) else {
        panic!("not leader");
    };
    // A twin arrives on another worker and waits.
    let Claim::Follower { deadline_ms } =
        coalesce::claim(&store, &key, now + 5, cfg.coalesce_wait_ms, 2)
    else {
        panic!("not follower");
    };
    assert_eq!(deadline_ms, now + cfg.coalesce_wait_ms);
    assert_eq!(
        coalesce::poll(&store, &key, now + 50, deadline_ms),
        Poll::KeepWaiting
    );
    // The leader's streamed answer passes through and is stored.
    let mut asm = Fed::new(Dialect::Chat, cfg.max_entry_bytes).unwrap();
    asm.feed(UPSTREAM.as_bytes());
    let entry = asm.finish(cfg.stamp(now + 100, 0.5)).unwrap();
    let ins = store.insert(&key, &entry, now + 100).unwrap();
    assert_eq!(ins.replaced, Replaced::Empty);
    assert_eq!(
        ins.totals,
        Some(Totals {
            entries: 1,
            bytes: ins.bytes_delta as u64
        })
    );
    assert!(coalesce::release(&store, &lease));
    // The follower is answered from it, as a stream.
    let Poll::Ready {
        entry: got,
        age_s: 0,
    } = coalesce::poll(&store, &key, now + 120, deadline_ms)
    else {
        panic!("not ready");
    };
    let reply = got.reply(true, true).unwrap();
    let mut again = Fed::new(Dialect::Chat, cfg.max_entry_bytes).unwrap();
    again.feed(&reply.body);
    assert_eq!(
        json_of(again.finish(STAMP).unwrap().body()),
        json_of(entry.body())
    );
    // A plain call of the same tenant hits the same entry as JSON.
    let plain = br#"{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
    let Decision::Cacheable(Cacheable {
        key: k2,
        stream: false,
        ..
    }) = decide(
        &cfg,
        &CacheRequest {
            body: Json::parse(plain).as_ref(),
            ..req
        },
    )
    else {
        panic!();
    };
    assert_eq!(k2, key);
    let Lookup::Hit { entry: hit, age_s } = store.lookup(&key, now + 3_100) else {
        panic!("no hit");
    };
    assert_eq!(age_s, 3);
    assert_eq!(hit.reply(false, false).unwrap().body, entry.body());
    // Another tenant misses.
    let other = [Some("Bearer t2"), None];
    let Decision::Cacheable(Cacheable { key: k3, .. }) = decide(
        &cfg,
        &CacheRequest {
            credentials: &other,
            ..req
        },
    ) else {
        panic!();
    };
    assert_eq!(store.lookup(&k3, now + 200), Lookup::Miss);
}

#[test]
fn statuses_name_headers_and_metrics() {
    assert_eq!(CacheStatus::Coalesced.header(), "COALESCED");
    assert_eq!(CacheStatus::Stale.label(), "stale");
}

mod props {
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    use super::*;
    use crate::fuzz;

    fn opt_text() -> impl Strategy<Value = Value> {
        prop_oneof![Just(Value::Null), fuzz::text().prop_map(Value::from)]
    }

    fn logprobs() -> impl Strategy<Value = Value> {
        prop_oneof![
            3 => Just(Value::Null),
            1 => (fuzz::text(), -20.0f64..0.0).prop_map(|(t, lp)| json!({
                "content": [{"token": t, "logprob": lp, "bytes": null, "top_logprobs": []}],
                "refusal": null,
            })),
        ]
    }

    fn tool_call() -> impl Strategy<Value = Value> {
        ("[a-z0-9_]{1,8}", "[a-z_]{1,8}", fuzz::text()).prop_map(|(id, name, args)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
        })
    }

    fn message() -> impl Strategy<Value = Value> {
        (
            opt_text(),
            opt_text(),
            prop::option::of(fuzz::text()),
            prop::collection::vec(tool_call(), 0..3),
        )
            .prop_map(|(content, refusal, reasoning, calls)| {
                let mut m = Map::new();
                m.insert("role".into(), Value::from("assistant"));
                m.insert("content".into(), content);
                m.insert("refusal".into(), refusal);
                if let Some(r) = reasoning {
                    m.insert("reasoning_content".into(), Value::from(r));
                }
                if !calls.is_empty() {
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                Value::Object(m)
            })
    }

    fn finish() -> impl Strategy<Value = Value> {
        prop::sample::select(vec!["stop", "length", "tool_calls", "content_filter"])
            .prop_map(Value::from)
    }

    fn head(object: &'static str) -> impl Strategy<Value = Map<String, Value>> {
        (
            fuzz::text(),
            any::<u32>(),
            fuzz::text(),
            prop::option::of("fp_[a-z0-9]{1,6}"),
            prop::option::of((0u32..1000, 0u32..1000)),
        )
            .prop_map(move |(id, created, model, fp, usage)| {
                let mut a = Map::new();
                a.insert("id".into(), Value::from(id));
                a.insert("object".into(), Value::from(object));
                a.insert("created".into(), Value::from(created));
                a.insert("model".into(), Value::from(model));
                if let Some(fp) = fp {
                    a.insert("system_fingerprint".into(), Value::from(fp));
                }
                if let Some((p, c)) = usage {
                    a.insert(
                        "usage".into(),
                        json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}),
                    );
                }
                a
            })
    }

    fn chat_answer() -> impl Strategy<Value = Value> {
        let choice = (message(), logprobs(), finish());
        (head("chat.completion"), prop::collection::vec(choice, 1..4)).prop_map(|(mut a, cs)| {
            let choices = cs
                .into_iter()
                .enumerate()
                .map(|(i, (m, lp, f))| json!({"index": i, "message": m, "logprobs": lp, "finish_reason": f}))
                .collect();
            a.insert("choices".into(), Value::Array(choices));
            Value::Object(a)
        })
    }

    fn text_answer() -> impl Strategy<Value = Value> {
        let lp = prop_oneof![
            3 => Just(Value::Null),
            1 => fuzz::text().prop_map(|t| json!({"tokens": [t], "token_logprobs": [-0.5], "top_logprobs": null, "text_offset": [0]})),
        ];
        let choice = (fuzz::text(), lp, finish());
        (head("text_completion"), prop::collection::vec(choice, 1..4)).prop_map(|(mut a, cs)| {
            let choices = cs
                .into_iter()
                .enumerate()
                .map(|(i, (t, lp, f))| json!({"text": t, "index": i, "logprobs": lp, "finish_reason": f}))
                .collect();
            a.insert("choices".into(), Value::Array(choices));
            Value::Object(a)
        })
    }

    /// Stores `answer`, replays it as SSE cut at `cuts`, reassembles it and
    /// checks the same entry comes back, byte for byte.
    fn replayed_and_reassembled(
        dialect: Dialect,
        answer: &Value,
        cuts: &[usize],
    ) -> Result<(), TestCaseError> {
        let body = serde_json::to_vec(answer).unwrap();
        let entry = Entry::from_json(dialect, 200, &body, STAMP, 1 << 20).unwrap();
        for include_usage in [true, false] {
            let sse = entry.reply(true, include_usage).unwrap().body;
            let mut asm = Fed::new(dialect, 1 << 20).unwrap();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (sse.len() + 1)).collect();
            cuts.sort_unstable();
            let mut from = 0;
            for c in cuts.into_iter().chain([sse.len()]) {
                asm.feed(&sse[from..c]);
                from = c;
            }
            let again = asm.finish(STAMP);
            prop_assert!(
                again.is_ok(),
                "{:?}: {}",
                again,
                String::from_utf8_lossy(&sse)
            );
            let again = again.unwrap();
            let mut want = answer.clone();
            if !include_usage {
                want.as_object_mut().unwrap().remove("usage");
            }
            prop_assert_eq!(json_of(again.body()), want);
            if include_usage {
                prop_assert_eq!(again.body(), entry.body());
                prop_assert_eq!(again.model(), entry.model());
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(fuzz::config(96))]

        /// A stored chat answer replayed as a stream and reassembled is the
        /// stored answer again, wherever the stream is cut.
        #[test]
        fn chat_replay_reassembles_to_the_entry(answer in chat_answer(), cuts in prop::collection::vec(any::<usize>(), 0..6)) {
            replayed_and_reassembled(Dialect::Chat, &answer, &cuts)?;
        }

        /// The same for text completions.
        #[test]
        fn text_replay_reassembles_to_the_entry(answer in text_answer(), cuts in prop::collection::vec(any::<usize>(), 0..6)) {
            replayed_and_reassembled(Dialect::Completions, &answer, &cuts)?;
        }

        /// An encoded entry decodes to itself; any damage decodes to an
        /// error or some entry, never a panic or a huge allocation.
        #[test]
        fn entries_encode_and_survive_damage(answer in chat_answer(), at: usize, byte: u8, cut: usize) {
            let body = serde_json::to_vec(&answer).unwrap();
            let entry = Entry::from_json(Dialect::Chat, 200, &body, STAMP, 1 << 20).unwrap();
            let bytes = entry.encode().unwrap();
            prop_assert_eq!(Entry::decode(&bytes), Ok(entry));
            let mut damaged = bytes.clone();
            damaged[at % bytes.len()] = byte;
            let _ = Entry::decode(&damaged);
            let _ = Entry::decode(&bytes[..cut % bytes.len()]);
        }
    }
}

use super::*;
use crate::dialect::features::message_tokens;
use crate::dialect::request::cap_max_tokens;
use crate::dialect::Dialect;

/// Which messages of a chat call to keep.
fn keep_history(
    messages: &[Json],
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> Option<Vec<bool>> {
    keep_turns(Dialect::Chat, messages, max_turns, max_prompt_tokens)
}

/// Leaves out of a chat body the messages [`keep_history`] does not keep.
fn trim_history(
    doc: &mut Document,
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> bool {
    trim_turns(doc, Dialect::Chat, max_turns, max_prompt_tokens)
}

/// The body after `f` edited it, `None` when `f` changed nothing.
fn edited(body: &[u8], f: impl FnOnce(&mut Document) -> bool) -> Option<String> {
    let mut doc = Document::parse(body.to_vec());
    let changed = f(&mut doc);
    let text = String::from_utf8(doc.into_bytes()).unwrap();
    if !changed {
        assert_eq!(
            text.as_bytes(),
            body,
            "a body no edit changed is left as it was"
        );
    }
    changed.then_some(text)
}

fn cap(body: &str, cap: u64) -> Option<String> {
    edited(body.as_bytes(), |d| {
        cap_max_tokens(d, cap, TokenField::MaxTokens)
    })
}

#[test]
fn caps_lower_or_set_the_limit_the_client_used() {
    for (body, want) in [
        (r#"{"max_tokens":2048}"#, Some(r#"{"max_tokens":512}"#)),
        (r#"{"max_tokens":2.048e3}"#, Some(r#"{"max_tokens":512}"#)),
        (r#"{"max_tokens":512}"#, None),
        (r#"{"max_tokens":100}"#, None),
        (r#"{"max_tokens":0}"#, None),
        (
            r#"{"model":"m","max_completion_tokens":4096}"#,
            Some(r#"{"model":"m","max_completion_tokens":512}"#),
        ),
        (
            r#"{"max_tokens":9000, "max_completion_tokens":600}"#,
            Some(r#"{"max_tokens":512, "max_completion_tokens":512}"#),
        ),
        (
            r#"{"max_tokens":100, "max_completion_tokens":600}"#,
            Some(r#"{"max_tokens":100, "max_completion_tokens":512}"#),
        ),
        (
            r#"{"model":"m"}"#,
            Some(r#"{"model":"m","max_tokens":512}"#),
        ),
        ("{}", Some(r#"{"max_tokens":512}"#)),
        (r#"{"max_tokens":null}"#, Some(r#"{"max_tokens":512}"#)),
        (
            r#"{"max_completion_tokens":null,"a":1}"#,
            Some(r#"{"max_completion_tokens":512,"a":1}"#),
        ),
        // Not understood: left alone.
        (r#"{"max_tokens":-1}"#, None),
        (r#"{"max_tokens":1.5}"#, None),
        (r#"{"max_tokens":"2048"}"#, None),
        (r#"{"max_tokens":99999999999999999999999}"#, None),
        (r#"{"max_tokens":1,"max_tokens":2}"#, None),
        ("[]", None),
        ("{", None),
    ] {
        assert_eq!(cap(body, 512).as_deref(), want, "{body}");
    }
    assert_eq!(
        edited(b"{}", |d| cap_max_tokens(
            d,
            7,
            TokenField::MaxCompletionTokens
        ))
        .as_deref(),
        Some(r#"{"max_completion_tokens":7}"#)
    );
}

fn msg(role: &str, content: &str) -> String {
    format!(r#"{{"role":"{role}","content":"{content}"}}"#)
}

fn conversation(messages: &[String]) -> String {
    format!(
        r#"{{"model":"m","messages":[{}],"stream":true}}"#,
        messages.join(",")
    )
}

fn trim(body: &str, turns: Option<u64>, tokens: Option<u64>) -> Option<String> {
    edited(body.as_bytes(), |d| trim_history(d, turns, tokens))
}

#[test]
fn keeps_system_the_current_turn_and_the_newest_turns() {
    let sys = msg("system", "be brief");
    let dev = msg("developer", "rules");
    let (u1, a1) = (msg("user", "one"), msg("assistant", "1"));
    let (u2, a2) = (msg("user", "two"), msg("assistant", "2"));
    let (u3, a3) = (msg("user", "three"), msg("assistant", "3"));
    let u4 = msg("user", "four");
    let all = [&sys, &u1, &a1, &u2, &a2, &dev, &u3, &a3, &u4].map(String::clone);
    let body = conversation(&all);
    let want = |m: &[&String]| {
        Some(conversation(
            &m.iter().map(|s| (*s).clone()).collect::<Vec<_>>(),
        ))
    };
    assert_eq!(
        trim(&body, Some(2), None),
        want(&[&sys, &dev, &u3, &a3, &u4])
    );
    assert_eq!(trim(&body, Some(1), None), want(&[&sys, &dev, &u4]));
    assert_eq!(
        trim(&body, Some(3), None),
        want(&[&sys, &u2, &a2, &dev, &u3, &a3, &u4])
    );
    assert_eq!(trim(&body, Some(4), None), None);
    assert_eq!(trim(&body, Some(40), None), None);
    // Tokens: "be brief" 2, "rules" 2, "four" 1 → 5 always; u3+a3 = 2+1.
    assert_eq!(trim(&body, None, Some(7)), want(&[&sys, &dev, &u4]));
    assert_eq!(
        trim(&body, None, Some(8)),
        want(&[&sys, &dev, &u3, &a3, &u4])
    );
    assert_eq!(trim(&body, None, Some(1)), want(&[&sys, &dev, &u4]));
    assert_eq!(trim(&body, Some(1), Some(1_000)), want(&[&sys, &dev, &u4]));
}

#[test]
fn tool_calls_stay_with_their_answers() {
    let u1 = msg("user", "weather?");
    let call = r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{}"}}]}"#.to_string();
    let answer = r#"{"role":"tool","tool_call_id":"c1","content":"sunny"}"#.to_string();
    let a1 = msg("assistant", "sunny");
    let u2 = msg("user", "and tomorrow?");
    // The current turn runs to the end: a tool loop after the last user
    // message is always sent whole.
    let body = conversation(&[
        u1.clone(),
        a1.clone(),
        u2.clone(),
        call.clone(),
        answer.clone(),
    ]);
    assert_eq!(
        trim(&body, Some(1), None),
        Some(conversation(&[u2.clone(), call.clone(), answer.clone()]))
    );
    // A user message between a call and its answer joins them in one turn.
    let odd = conversation(&[u1.clone(), call.clone(), u2.clone(), answer.clone()]);
    assert_eq!(trim(&odd, Some(1), None), None);
    let odd = conversation(&[
        msg("user", "0"),
        u1.clone(),
        call.clone(),
        u2.clone(),
        answer.clone(),
    ]);
    assert_eq!(
        trim(&odd, Some(1), None),
        Some(conversation(&[u1, call, u2, answer]))
    );
}

#[test]
fn leaves_alone_what_it_does_not_understand() {
    for body in [
        r#"{"messages":[]}"#,
        r#"{"messages":[{"role":"assistant","content":"a"},{"role":"assistant","content":"b"}]}"#,
        r#"{"messages":[{"content":"a"},{"role":"user","content":"b"}]}"#,
        r#"{"messages":[{"role":1},{"role":"user"}]}"#,
        r#"{"messages":[{"role":"user","role":"user"},{"role":"user"}]}"#,
        r#"{"messages":["hi",{"role":"user"}]}"#,
        r#"{"messages":"hi"}"#,
        r#"{"prompt":"hi"}"#,
    ] {
        assert_eq!(trim(body, Some(1), Some(1)), None, "{body}");
    }
}

#[test]
fn shape_reports_what_changed() {
    let body = conversation(&[msg("user", "a"), msg("assistant", "b"), msg("user", "c")]);
    let limits = Limits {
        max_tokens: Some(64),
        history_turns: Some(1),
        prompt_tokens: None,
    };
    let mut doc = Document::parse(body.as_bytes().to_vec());
    let s = shape(&mut doc, Dialect::Chat, &limits, TokenField::MaxTokens);
    assert_eq!(s.header().as_deref(), Some("max_tokens,history"));
    assert_eq!(
        String::from_utf8(doc.into_bytes()).unwrap(),
        r#"{"model":"m","messages":[{"role":"user","content":"c"}],"stream":true,"max_tokens":64}"#
    );
    let only_history = Limits {
        max_tokens: None,
        ..limits
    };
    let shaped = |body: &str, limits: &Limits| {
        let mut doc = Document::parse(body.as_bytes().to_vec());
        let changes = shape(&mut doc, Dialect::Chat, limits, TokenField::MaxTokens);
        if changes.is_empty() {
            assert_eq!(
                doc.bytes(),
                body.as_bytes(),
                "unchanged when nothing changed"
            );
        }
        changes
    };
    assert_eq!(
        shaped(&body, &only_history).header().as_deref(),
        Some("history")
    );
    assert!(shaped(&body, &Limits::default()).is_empty());
    // A limit that is not a whole number: the history is left alone too.
    let odd = r#"{"max_tokens":"lots","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
    assert!(shaped(odd, &only_history).is_empty());
    // A key named twice anywhere: never rewritten.
    let dup = r#"{"messages":[{"role":"user","content":"a","content":"b"}]}"#;
    assert!(shaped(dup, &limits).is_empty());
    assert_eq!(Changes::default().header(), None);
}

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    /// A message kind of a generated conversation.
    #[derive(Debug, Clone)]
    enum Kind {
        System,
        User,
        Assistant,
        /// An assistant calling `n` tools, answered right after.
        ToolLoop(usize),
    }

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            1 => Just(Kind::System),
            4 => Just(Kind::User),
            3 => Just(Kind::Assistant),
            2 => (1usize..3).prop_map(Kind::ToolLoop),
        ]
    }

    /// A valid conversation: tool answers right after their call.
    fn conversation() -> impl Strategy<Value = Vec<Json>> {
        prop::collection::vec((kind(), 0usize..120), 1..24).prop_map(|kinds| {
            let mut out = Vec::new();
            let mut id = 0;
            for (k, len) in kinds {
                let content = Json::String("x".repeat(len));
                let plain = |role: &str| {
                    Json::Object(vec![
                        ("role".into(), Json::String(role.into())),
                        ("content".into(), content.clone()),
                    ])
                };
                match k {
                    Kind::System => out.push(plain("system")),
                    Kind::User => out.push(plain("user")),
                    Kind::Assistant => out.push(plain("assistant")),
                    Kind::ToolLoop(n) => {
                        let ids: Vec<String> = (0..n).map(|i| format!("c{}", id + i)).collect();
                        id += n;
                        let calls = ids
                            .iter()
                            .map(|i| Json::Object(vec![("id".into(), Json::String(i.clone()))]))
                            .collect();
                        out.push(Json::Object(vec![
                            ("role".into(), Json::String("assistant".into())),
                            ("tool_calls".into(), Json::Array(calls)),
                        ]));
                        for i in ids {
                            out.push(Json::Object(vec![
                                ("role".into(), Json::String("tool".into())),
                                ("tool_call_id".into(), Json::String(i)),
                                ("content".into(), content.clone()),
                            ]));
                        }
                    }
                }
            }
            out
        })
    }

    fn role(m: &Json) -> &str {
        match m.get("role") {
            Some(Json::String(r)) => r,
            _ => "",
        }
    }

    fn pinned(m: &Json) -> bool {
        matches!(role(m), "system" | "developer")
    }

    /// The pairs (call, answer) of tool calls.
    fn links(ms: &[Json]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (t, m) in ms.iter().enumerate() {
            if let Some(Json::String(id)) = m.get("tool_call_id") {
                for (a, c) in ms[..t].iter().enumerate() {
                    if let Some(Json::Array(calls)) = c.get("tool_calls") {
                        if calls
                            .iter()
                            .any(|x| x.get("id") == Some(&Json::String(id.clone())))
                        {
                            out.push((a, t));
                        }
                    }
                }
            }
        }
        out
    }

    /// What holds of any kept set: pinned and the current turn kept, the
    /// rest a suffix, tool calls and answers together.
    fn structural(ms: &[Json], keep: &[bool]) -> Result<(), TestCaseError> {
        prop_assert_eq!(keep.len(), ms.len());
        let last_user = ms.iter().rposition(|m| role(m) == "user").unwrap();
        for (i, m) in ms.iter().enumerate() {
            if pinned(m) || i >= last_user {
                prop_assert!(keep[i], "message {} must be kept", i);
            }
        }
        let rest: Vec<bool> = ms
            .iter()
            .zip(keep)
            .filter(|(m, _)| !pinned(m))
            .map(|(_, k)| *k)
            .collect();
        let first_kept = rest.iter().position(|k| *k).unwrap();
        prop_assert!(
            rest[first_kept..].iter().all(|k| *k),
            "not a suffix: {:?}",
            rest
        );
        prop_assert!(rest.contains(&false), "nothing dropped yet Some");
        for (a, t) in links(ms) {
            prop_assert_eq!(keep[a], keep[t], "call {} and answer {} split", a, t);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// In a valid conversation the kept turns are the most recent that
        /// fit: within both limits (or only what is always kept), and the
        /// next older turn would not have fit.
        #[test]
        fn keeps_the_newest_whole_turns_that_fit(
            ms in conversation(),
            turns in prop::option::of(1u64..6),
            tokens in prop::option::of(0u64..200),
        ) {
            let Some(keep) = keep_history(&ms, turns, tokens) else {
                return Ok(());
            };
            structural(&ms, &keep)?;
            let last_user = ms.iter().rposition(|m| role(m) == "user").unwrap();
            let starts = |i: usize| role(&ms[i]) == "user"
                || ms[..i].iter().all(pinned) && !pinned(&ms[i]);
            let kept_turns = (0..ms.len()).filter(|&i| keep[i] && !pinned(&ms[i]) && starts(i)).count() as u64;
            let used: u64 = (0..ms.len()).filter(|&i| keep[i]).map(|i| message_tokens(&ms[i])).sum();
            if let Some(max) = turns {
                prop_assert!(kept_turns <= max);
            }
            let only_mandatory = (0..last_user).all(|i| !keep[i] || pinned(&ms[i]));
            if let Some(max) = tokens {
                prop_assert!(used <= max || only_mandatory, "{} > {}", used, max);
            }
            // The turn just before the oldest kept one would break a limit.
            let oldest = (0..ms.len()).find(|&i| keep[i] && !pinned(&ms[i])).unwrap();
            let prev_start = (0..oldest).rev().find(|&i| !pinned(&ms[i]) && starts(i)).unwrap();
            let prev: u64 = (prev_start..oldest).filter(|&i| !pinned(&ms[i])).map(|i| message_tokens(&ms[i])).sum();
            let turn_full = turns.is_some_and(|t| kept_turns >= t);
            let tokens_full = tokens.is_some_and(|t| used + prev > t);
            prop_assert!(turn_full || tokens_full);
        }

        /// Any order of messages, tool answers anywhere: the structure holds,
        /// and the body rewrite keeps every other member and each kept
        /// message byte for byte.
        #[test]
        fn any_order_keeps_the_structure(
            ms in conversation(),
            order in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            turns in 1u64..4,
            seed: u64,
        ) {
            let mut ms = ms;
            for ix in order {
                let (a, b) = (ix.index(ms.len()), ms.len() - 1);
                ms.swap(a, b);
            }
            let body = Json::Object(vec![
                ("model".into(), Json::String("m".into())),
                ("messages".into(), Json::Array(ms.clone())),
                ("n".into(), Json::Number(format!("{}", seed % 7))),
            ]);
            let mut raw = Vec::new();
            body.write(&mut raw);
            let keep = keep_history(&ms, Some(turns), None);
            let mut doc = Document::parse(raw);
            let out = trim_history(&mut doc, Some(turns), None).then(|| doc.into_bytes());
            prop_assert_eq!(keep.is_some(), out.is_some());
            if let (Some(keep), Some(out)) = (keep, out) {
                structural(&ms, &keep)?;
                let kept: Vec<Json> = ms.iter().zip(&keep).filter(|(_, k)| **k).map(|(m, _)| m.clone()).collect();
                let want = Json::Object(vec![
                    ("model".into(), Json::String("m".into())),
                    ("messages".into(), Json::Array(kept)),
                    ("n".into(), Json::Number(format!("{}", seed % 7))),
                ]);
                let (mut got, mut wanted) = (Vec::new(), Vec::new());
                Json::parse(&out).unwrap().write(&mut got);
                want.write(&mut wanted);
                prop_assert_eq!(got, wanted);
            }
        }
    }
}

/// `body` of `dialect` with its history trimmed to `turns` turns.
fn trim_dialect(dialect: Dialect, body: &str, turns: u64) -> Option<serde_json::Value> {
    edited(body.as_bytes(), |d| {
        trim_turns(d, dialect, Some(turns), None)
    })
    .map(|t| serde_json::from_str(&t).unwrap())
}

#[test]
fn anthropic_turns_keep_a_tool_use_with_its_result() {
    let body = r#"{"model":"claude","max_tokens":64,"system":"be brief","messages":[
        {"role":"user","content":"one"},
        {"role":"assistant","content":"1"},
        {"role":"user","content":[{"type":"text","text":"weather?"}]},
        {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"w","input":{}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]},
        {"role":"assistant","content":"sunny"},
        {"role":"user","content":"three"}
    ]}"#;
    let texts = |v: &serde_json::Value| -> Vec<String> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].to_string())
            .collect()
    };
    // Two turns: the current one and the whole tool turn before it.
    let two = trim_dialect(Dialect::Messages, body, 2).unwrap();
    assert_eq!(two["system"], "be brief");
    let kept = texts(&two);
    assert_eq!(kept.len(), 5, "{kept:?}");
    assert!(kept[0].contains("weather?") && kept[2].contains("tool_result"));
    assert_eq!(two["messages"][0]["role"], "user");
    // One turn: the last user message alone.
    let one = trim_dialect(Dialect::Messages, body, 1).unwrap();
    assert_eq!(texts(&one), ["\"three\""]);
    assert_eq!(trim_dialect(Dialect::Messages, body, 3), None);
}

#[test]
fn responses_input_keeps_developer_items_and_calls_with_their_outputs() {
    let body = r#"{"model":"m","instructions":"be brief","input":[
        {"role":"developer","content":"rules"},
        {"role":"user","content":"one"},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"1"}]},
        {"role":"user","content":"weather?"},
        {"type":"function_call","call_id":"c1","name":"w","arguments":"{}"},
        {"type":"function_call_output","call_id":"c1","output":"sunny"},
        {"role":"user","content":"three"}
    ]}"#;
    let two = trim_dialect(Dialect::Responses, body, 2).unwrap();
    let items = two["input"].as_array().unwrap();
    assert_eq!(items.len(), 5, "{items:?}");
    assert_eq!(items[0]["role"], "developer");
    assert_eq!(items[1]["content"], "weather?");
    assert_eq!(items[3]["type"], "function_call_output");
    assert_eq!(two["instructions"], "be brief");
    let one = trim_dialect(Dialect::Responses, body, 1).unwrap();
    assert_eq!(one["input"].as_array().unwrap().len(), 2);
    // A string input has no turns to trim.
    assert_eq!(
        trim_dialect(Dialect::Responses, r#"{"input":"just this"}"#, 1),
        None
    );
}

#[test]
fn gemini_contents_keep_a_function_call_with_its_response_and_weigh_their_text() {
    let body = r#"{"contents":[
        {"role":"user","parts":[{"text":"one one one one one one one one"}]},
        {"role":"model","parts":[{"text":"1"}]},
        {"role":"user","parts":[{"text":"weather?"}]},
        {"role":"model","parts":[{"functionCall":{"name":"w","args":{}}}]},
        {"role":"user","parts":[{"functionResponse":{"name":"w","response":{"t":"sunny"}}}]},
        {"role":"model","parts":[{"text":"sunny"}]},
        {"parts":[{"text":"three"}]}
    ],"generationConfig":{"maxOutputTokens":9}}"#;
    // Two turns: the current one and the whole tool turn before it.
    let two = trim_dialect(Dialect::Gemini, body, 2).unwrap();
    let contents = two["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 5, "{contents:?}");
    assert_eq!(contents[0]["parts"][0]["text"], "weather?");
    assert!(contents[2]["parts"][0].get("functionResponse").is_some());
    assert_eq!(two["generationConfig"]["maxOutputTokens"], 9);
    assert_eq!(trim_dialect(Dialect::Gemini, body, 3), None);
    // By tokens: the long first turn is what does not fit.
    let tokens: Vec<u64> = Json::parse(body.as_bytes())
        .unwrap()
        .get("contents")
        .and_then(|c| match c {
            Json::Array(items) => Some(
                items
                    .iter()
                    .map(|c| Dialect::Gemini.request().turn_tokens(c))
                    .collect(),
            ),
            _ => None,
        })
        .unwrap();
    assert!(tokens[0] > tokens[2] && tokens[2] > 0, "{tokens:?}");
    let all: u64 = tokens.iter().sum();
    let messages = match Json::parse(body.as_bytes()).unwrap().get("contents") {
        Some(Json::Array(items)) => items.clone(),
        _ => unreachable!(),
    };
    let keep = keep_turns(Dialect::Gemini, &messages, None, Some(all - 1)).unwrap();
    assert_eq!(keep, [false, false, true, true, true, true, true]);
    assert_eq!(
        keep_turns(Dialect::Gemini, &messages, None, Some(all)),
        None
    );
}

#[test]
fn a_gemini_output_cap_is_shaped_in_its_generation_config() {
    let limits = Limits {
        max_tokens: Some(50),
        ..Limits::default()
    };
    let shaped = |body: &str| {
        edited(body.as_bytes(), |d| {
            !shape(d, Dialect::Gemini, &limits, TokenField::MaxTokens).is_empty()
        })
    };
    assert_eq!(
        shaped(r#"{"contents":[],"generationConfig":{"maxOutputTokens":500}}"#).as_deref(),
        Some(r#"{"contents":[],"generationConfig":{"maxOutputTokens":50}}"#)
    );
    assert_eq!(
        shaped(r#"{"contents":[]}"#).as_deref(),
        Some(r#"{"contents":[],"generationConfig":{"maxOutputTokens":50}}"#)
    );
    assert_eq!(
        shaped(r#"{"contents":[],"max_tokens":500,"generationConfig":{"maxOutputTokens":5}}"#),
        None,
        "a top-level field is no cap of Gemini's"
    );
}

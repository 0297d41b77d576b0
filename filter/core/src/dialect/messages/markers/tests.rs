use super::*;

const ASK: MarkAsk = MarkAsk {
    min_tokens: 100,
    hour: false,
};

/// About `n` estimated tokens of English.
fn words(n: usize) -> String {
    "lorem ".repeat(n * 2 / 3)
}

fn marked(body: &str, ask: &MarkAsk) -> (u32, Document) {
    let mut doc = Document::parse(body.as_bytes().to_vec());
    let n = mark(&mut doc, ask);
    // Still strict JSON; the tree kept (none once edited) is the bytes' own.
    if n > 0 {
        assert!(Json::parse(doc.bytes()).is_some() && doc.tree().is_none());
    } else {
        assert_eq!(doc.tree(), Json::parse(doc.bytes()).as_ref(), "{body}");
    }
    (n, doc)
}

fn text(doc: &Document) -> &str {
    std::str::from_utf8(doc.bytes()).unwrap()
}

/// Where the markers are: a path for each `cache_control` in the tree.
fn markers(doc: &Document) -> Vec<String> {
    let tree = Json::parse(doc.bytes()).unwrap();
    let mut out = Vec::new();
    let has = |v: &Json| v.get("cache_control").is_some();
    for (name, v) in [("tools", tree.get("tools")), ("system", tree.get("system"))] {
        if let Some(Json::Array(items)) = v {
            for (i, item) in items.iter().enumerate() {
                if has(item) {
                    out.push(format!("{name}[{i}]"));
                }
            }
        }
    }
    if let Some(Json::Array(ms)) = tree.get("messages") {
        for (i, m) in ms.iter().enumerate() {
            if let Some(Json::Array(blocks)) = m.get("content") {
                for (b, block) in blocks.iter().enumerate() {
                    if has(block) {
                        out.push(format!("messages[{i}][{b}]"));
                    }
                }
            }
        }
    }
    out
}

/// A conversation with a system prompt (JSON), tools whose description is
/// `tool` and `turns` turns after the first question.
fn conversation(system: &str, tool: &str, turns: usize) -> String {
    let mut ms = vec![r#"{"role":"user","content":"first"}"#.to_string()];
    for n in 0..turns {
        ms.push(format!(
            r#"{{"role":"assistant","content":[{{"type":"text","text":"answer {n}"}}]}}"#
        ));
        ms.push(format!(r#"{{"role":"user","content":"question {n}"}}"#));
    }
    format!(
        r#"{{"model":"claude-x", "max_tokens" : 1.0e3,"tools":[{{"name":"a","input_schema":{{}}}},{{"name":"b","description":{tool:?},"input_schema":{{}}}}],"system":{system},"messages":[{}]}}"#,
        ms.join(" ,\n ")
    )
}

#[test]
fn a_conversation_gets_four_markers_and_keeps_every_other_byte() {
    let system = format!("{:?}", words(200));
    let body = conversation(&system, &words(200), 2);
    let (n, doc) = marked(&body, &ASK);
    assert_eq!(n, 4);
    assert_eq!(
        markers(&doc),
        ["tools[1]", "system[0]", "messages[2][0]", "messages[4][0]"]
    );
    // Taking the markers out gives the body back, but for the strings
    // wrapped in their blocks.
    let marker = r#","cache_control":{"type":"ephemeral"}"#;
    let unmarked = text(&doc).replace(marker, "");
    let wrapped = |s: &str| format!(r#"[{{"type":"text","text":{s}}}]"#);
    let expected = body
        .replace(
            &format!(r#""system":{system}"#),
            &format!(r#""system":{}"#, wrapped(&system)),
        )
        .replace(
            r#""content":"question 0""#,
            &format!(r#""content":{}"#, wrapped(r#""question 0""#)),
        )
        .replace(
            r#""content":"question 1""#,
            &format!(r#""content":{}"#, wrapped(r#""question 1""#)),
        );
    assert_eq!(unmarked, expected);
    assert!(text(&doc).contains(r#" "max_tokens" : 1.0e3,"#));
}

#[test]
fn a_first_question_marks_the_shared_prefix_only() {
    let system = format!(
        r#"[{{"type":"text","text":{:?}}},{{"type":"text","text":""}}]"#,
        words(200)
    );
    let (n, doc) = marked(&conversation(&system, &words(200), 0), &ASK);
    assert_eq!(n, 2);
    // The empty text block cannot carry a marker: the one before does.
    assert_eq!(markers(&doc), ["tools[1]", "system[0]"]);
}

#[test]
fn only_a_prefix_long_enough_is_marked() {
    let short = conversation(r#""be brief""#, "d", 3);
    let (n, doc) = marked(&short, &ASK);
    assert_eq!((n, text(&doc)), (0, short.as_str()));
    // The system prompt alone is not enough; with the history it is.
    let ask = MarkAsk {
        min_tokens: 160,
        ..ASK
    };
    let body = conversation(&format!("{:?}", words(120)), "d", 30);
    let (n, doc) = marked(&body, &ask);
    assert_eq!(n, 2, "{}", text(&doc));
    assert_eq!(markers(&doc), ["messages[58][0]", "messages[60][0]"]);
}

#[test]
fn a_client_marker_anywhere_leaves_the_body_as_it_is() {
    let long = format!("{:?}", words(200));
    for body in [
        format!(
            r#"{{"cache_control":{{"type":"ephemeral"}},"system":{long},"messages":[{{"role":"user","content":"a"}}]}}"#
        ),
        format!(
            r#"{{"tools":[{{"name":"t","cache_control":{{"type":"ephemeral"}}}}],"system":{long},"messages":[]}}"#
        ),
        format!(
            r#"{{"system":[{{"type":"text","text":{long},"cache_control":{{"type":"ephemeral"}}}}],"messages":[]}}"#
        ),
        format!(
            r#"{{"system":{long},"messages":[{{"role":"user","content":[{{"type":"text","text":"a","cache_control":{{"type":"ephemeral"}}}}]}},{{"role":"assistant","content":"b"}},{{"role":"user","content":"c"}}]}}"#
        ),
        // Nested in a tool result, its key spelled with an escape.
        format!(
            r#"{{"system":{long},"messages":[{{"role":"assistant","content":"b"}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":[{{"type":"text","text":"r","\u0063ache_control":{{"type":"ephemeral"}}}}]}}]}}]}}"#
        ),
    ] {
        let (n, doc) = marked(&body, &ASK);
        assert_eq!((n, text(&doc)), (0, body.as_str()));
    }
}

#[test]
fn thinking_is_never_marked_and_an_hour_is_asked_for() {
    let body = format!(
        r#"{{"system":{:?},"messages":[{{"role":"user","content":"a"}},
        {{"role":"assistant","content":[{{"type":"text","text":"b"}},{{"type":"thinking","thinking":"t","signature":"s"}}]}},
        {{"role":"user","content":[{{"type":"tool_result","tool_use_id":"x","content":"r"}}, {{ }}]}}]}}"#,
        words(200)
    );
    let ask = MarkAsk { hour: true, ..ASK };
    let (n, doc) = marked(&body, &ask);
    assert_eq!(n, 3);
    assert_eq!(
        markers(&doc),
        ["system[0]", "messages[0][0]", "messages[2][0]"]
    );
    // The last message's last block is an object with no type: the
    // tool result before it carries the marker.
    let last = r#"{"type":"tool_result","tool_use_id":"x","content":"r","cache_control":{"type":"ephemeral","ttl":"1h"}}"#;
    assert!(text(&doc).contains(last), "{}", text(&doc));
}

#[test]
fn what_is_not_a_messages_body_gets_nothing() {
    for body in [
        "",
        "[]",
        r#"{"messages":{}}"#,
        r#"{"system":3,"messages":[1,2]}"#,
        r#"{"system":"x","system":"y"}"#,
    ] {
        let (n, doc) = marked(
            body,
            &MarkAsk {
                min_tokens: 0,
                ..ASK
            },
        );
        assert_eq!((n, text(&doc)), (0, body));
    }
}

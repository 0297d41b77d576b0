use serde_json::json;

use super::*;

fn service(written: serde_json::Value) -> Result<GuardService, ConfigError> {
    RawGuardService::read(&written).and_then(GuardService::compile)
}

fn body_of(s: &GuardService, texts: &[&str]) -> serde_json::Value {
    let (headers, body) = s.request(texts, "chat", Side::Prompt).unwrap();
    assert!(headers.contains(&(":method".into(), "POST".into())));
    assert!(headers.contains(&("content-length".into(), body.len().to_string())));
    serde_json::from_slice(&body).unwrap()
}

fn path_of(s: &GuardService) -> &str {
    &s.service.path
}

#[test]
fn each_preset_asks_in_its_services_shape() {
    let openai = service(json!({"preset": "openai_moderation", "cluster": "moderation"})).unwrap();
    assert_eq!(path_of(&openai), "/v1/moderations");
    assert_eq!(
        body_of(&openai, &["a", "b"]),
        json!({"model": "omni-moderation-latest", "input": ["a", "b"]})
    );
    let azure = service(json!({"preset": "azure_content_safety", "cluster": "cs"})).unwrap();
    assert_eq!(
        path_of(&azure),
        "/contentsafety/text:analyze?api-version=2024-09-01"
    );
    assert_eq!(
        body_of(&azure, &["a", "b"]),
        json!({"text": "a\nb", "outputType": "FourSeverityLevels"})
    );
    let long = "x".repeat(AZURE_MAX_CHARS + 1);
    assert_eq!(
        azure.request(&[&long], "chat", Side::Prompt).unwrap_err(),
        Failure::TooLong
    );
    let bedrock = service(json!({"preset": "bedrock_guardrail", "cluster": "bedrock",
        "guardrail_id": "gr0abc12", "guardrail_version": "3"}))
    .unwrap();
    assert_eq!(path_of(&bedrock), "/guardrail/gr0abc12/version/3/apply");
    assert_eq!(
        body_of(&bedrock, &["a"]),
        json!({"source": "INPUT", "content": [{"text": {"text": "a"}}]})
    );
    let hook =
        service(json!({"preset": "webhook", "cluster": "hook", "path": "/v1/verdict"})).unwrap();
    assert_eq!(path_of(&hook), "/v1/verdict");
    assert_eq!(
        body_of(&hook, &["a"]),
        json!({"api": "chat", "texts": ["a"]})
    );
}

#[test]
fn each_presets_verdict_is_read() {
    let read = |s: &GuardService, body: serde_json::Value, sent| {
        s.read(Some(200), body.to_string().as_bytes(), sent)
    };
    let openai = service(json!({"preset": "openai_moderation", "cluster": "m"})).unwrap();
    let result = |flagged| {
        json!({"id": "modr-1", "model": "omni-moderation-latest",
        "results": [{"flagged": false}, {"flagged": flagged, "categories": {"violence": flagged}}]})
    };
    assert_eq!(read(&openai, result(false), 2), Ok(Judged::Pass));
    assert_eq!(read(&openai, result(true), 2), Ok(Judged::Flagged(None)));
    assert_eq!(
        read(&openai, json!({"results": []}), 2),
        Err(Failure::Invalid)
    );

    let azure = service(json!({"preset": "azure_content_safety", "cluster": "cs"})).unwrap();
    let analysis = |severity| {
        json!({"blocklistsMatch": [], "categoriesAnalysis": [
        {"category": "Hate", "severity": 0}, {"category": "Violence", "severity": severity}]})
    };
    assert_eq!(read(&azure, analysis(2), 1), Ok(Judged::Pass));
    assert_eq!(read(&azure, analysis(4), 1), Ok(Judged::Flagged(None)));
    let listed = json!({"categoriesAnalysis": [], "blocklistsMatch": [
        {"blocklistName": "words", "blocklistItemId": "1", "blocklistItemText": "x"}]});
    assert_eq!(read(&azure, listed, 1), Ok(Judged::Flagged(None)));
    let strict = service(json!({"preset": "azure_content_safety", "cluster": "cs",
        "threshold": 2}))
    .unwrap();
    assert_eq!(read(&strict, analysis(2), 1), Ok(Judged::Flagged(None)));

    let bedrock = service(json!({"preset": "bedrock_guardrail", "cluster": "b",
        "guardrail_id": "abc", "action": "mask"}))
    .unwrap();
    assert_eq!(path_of(&bedrock), "/guardrail/abc/version/DRAFT/apply");
    assert_eq!(
        read(&bedrock, json!({"action": "NONE", "outputs": []}), 1),
        Ok(Judged::Pass)
    );
    let intervened = json!({"action": "GUARDRAIL_INTERVENED",
        "outputs": [{"text": "call {PHONE}"}, {"text": "hi"}]});
    assert_eq!(
        read(&bedrock, intervened.clone(), 2),
        Ok(Judged::Flagged(Some(vec![
            "call {PHONE}".into(),
            "hi".into()
        ])))
    );
    // Masked texts that are not one per text sent cannot be put back.
    assert_eq!(read(&bedrock, intervened, 3), Err(Failure::Invalid));
    // A policy that blocked: its refusal in `outputs` is no masked text.
    let refused = json!({"action": "GUARDRAIL_INTERVENED",
        "outputs": [{"text": "Sorry."}],
        "assessments": [{"contentPolicy": {"filters": [{"type": "HATE", "action": "BLOCKED"}]}}]});
    assert_eq!(read(&bedrock, refused, 1), Ok(Judged::Flagged(None)));

    let hook = service(json!({"preset": "webhook", "cluster": "h"})).unwrap();
    assert_eq!(read(&hook, json!({"flagged": false}), 1), Ok(Judged::Pass));
    assert_eq!(
        read(&hook, json!({"flagged": true, "texts": ["x"]}), 1),
        Ok(Judged::Flagged(None))
    );
    let masking = service(json!({"preset": "webhook", "cluster": "h", "action": "mask"})).unwrap();
    assert_eq!(
        read(&masking, json!({"flagged": true, "texts": ["x"]}), 1),
        Ok(Judged::Flagged(Some(vec!["x".into()])))
    );
    assert_eq!(
        read(&masking, json!({"flagged": true}), 1),
        Ok(Judged::Flagged(None)),
        "flagged, nothing masked: refused"
    );
    assert_eq!(
        read(&masking, json!({"flagged": true, "texts": [1]}), 1),
        Err(Failure::Invalid)
    );
    assert_eq!(
        read(&hook, json!({"verdict": "ok"}), 1),
        Err(Failure::Invalid)
    );
}

#[test]
fn no_answer_or_another_status_is_the_services_failure() {
    let hook = service(json!({"preset": "webhook", "cluster": "h"})).unwrap();
    assert_eq!(hook.read(None, b"", 1), Err(Failure::Timeout));
    assert_eq!(hook.read(Some(504), b"", 1), Err(Failure::Timeout));
    assert_eq!(hook.read(Some(500), b"{}", 1), Err(Failure::Status));
    assert_eq!(
        hook.read(Some(200), b"{\"flagged\":", 1),
        Err(Failure::Invalid)
    );
}

#[test]
fn a_bad_service_is_refused_by_field() {
    let refused = |written: serde_json::Value, field: &str| {
        let e = service(written).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    };
    refused(json!({"cluster": "c"}), "preset");
    refused(json!({"preset": "perspective", "cluster": "c"}), "preset");
    refused(json!({"preset": "webhook"}), "cluster");
    refused(
        json!({"preset": "openai_moderation", "cluster": "c", "action": "mask"}),
        "action",
    );
    refused(
        json!({"preset": "bedrock_guardrail", "cluster": "c"}),
        "guardrail_id",
    );
    refused(
        json!({"preset": "bedrock_guardrail", "cluster": "c", "guardrail_id": "../x"}),
        "guardrail_id",
    );
    refused(
        json!({"preset": "webhook", "cluster": "c", "on_error": "maybe"}),
        "on_error",
    );
    refused(
        json!({"preset": "webhook", "cluster": "c", "timeout_ms": 0}),
        "timeout_ms",
    );
    refused(
        json!({"preset": "azure_content_safety", "cluster": "c", "threshold": 9}),
        "threshold",
    );
    refused(
        json!({"preset": "webhook", "cluster": "c", "name": "a b"}),
        "name",
    );
    refused(
        json!({"preset": "webhook", "cluster": "c", "mode": "after"}),
        "mode",
    );
}

#[test]
fn parallel_asks_alongside_the_call_and_cannot_mask() {
    let before = service(json!({"preset": "webhook", "cluster": "c"})).unwrap();
    assert!(!before.parallel, "`before` by default");
    let parallel =
        service(json!({"preset": "webhook", "cluster": "c", "mode": "parallel"})).unwrap();
    assert!(parallel.parallel);
    let e = service(
        json!({"preset": "webhook", "cluster": "c", "mode": "parallel",
        "action": "mask"}),
    )
    .unwrap_err();
    assert_eq!(e.field, "mode");
    assert!(e.to_string().contains("cannot `mask`"), "{e}");
}

#[test]
fn the_texts_are_what_the_prompt_says_and_go_back_where_they_were() {
    let tree = Json::parse(
        br#"{"model":"m","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"call 555"},
                {"type":"image_url","image_url":{"url":"data:x"}}]},
            {"role":"assistant","tool_calls":[{"id":"c1","type":"function",
                "function":{"name":"lookup","arguments":"{\"q\":\"555\"}"}}]}]}"#,
    )
    .unwrap();
    let fields = &["messages", "prompt"];
    let texts = texts(&tree, fields, 1 << 20).unwrap();
    assert_eq!(texts, ["be brief", "call 555", "{\"q\":\"555\"}"]);
    assert_eq!(super::texts(&tree, fields, 10), None);
    let masked: Vec<String> = ["be brief", "call [PHONE]", "{\"q\":\"[PHONE]\"}"]
        .map(String::from)
        .to_vec();
    let edits = put_back(&tree, fields, &masked);
    let [(field, bytes, _)] = edits.as_slice() else {
        panic!("{edits:?}")
    };
    assert_eq!(*field, "messages");
    let sent: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    assert_eq!(sent[1]["content"][0]["text"], "call [PHONE]");
    assert_eq!(sent[1]["content"][1]["image_url"]["url"], "data:x");
    assert_eq!(
        sent[2]["tool_calls"][0]["function"]["arguments"],
        "{\"q\":\"[PHONE]\"}"
    );
    assert_eq!(sent[0]["role"], "system");
    // Nothing masked: nothing edited.
    let same: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
    assert!(put_back(&tree, fields, &same).is_empty());
}

#[test]
fn a_field_of_the_wrong_type_or_no_field_is_refused() {
    let refused = |written: serde_json::Value, field: &str| {
        let e = service(written).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    };
    refused(json!({"preset": 1, "cluster": "c"}), "preset");
    refused(
        json!({"preset": "webhook", "cluster": "c", "timeout_ms": "1"}),
        "timeout_ms",
    );
    refused(
        json!({"preset": "webhook", "cluster": "c", "headers": {"k": 1}}),
        "headers.k",
    );
    refused(
        json!({"preset": "webhook", "cluster": "c", "headers": []}),
        "headers",
    );
    refused(
        json!({"preset": "webhook", "cluster": "c", "colour": "red"}),
        "colour",
    );
    refused(json!([]), ".");
}

use super::*;
use crate::config::error::ConfigError;
use crate::json::Json;

fn rules(json: &str) -> Guardrails {
    let raw = ConfigError::from_json(format!(r#"{{"rules":{json}}}"#).as_bytes()).unwrap();
    Guardrails::compile(raw).unwrap()
}

/// Each piece through one window, the last one ending it: what passed
/// after each, or the rule that blocked.
fn through(g: &Guardrails, vault: &mut Vault, pieces: &[&str]) -> Result<Vec<String>, usize> {
    let mut w = Window::default();
    let mut verdict = Verdict::default();
    let mut out = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        let last = i + 1 == pieces.len();
        match w.push(g, vault, &mut verdict, p, last) {
            Out::Pass(t) => out.push(t),
            Out::Blocked(k) => return Err(k),
        }
        assert!(w.held() <= MAX_HELD);
    }
    assert_eq!(w.held(), 0, "the last piece leaves nothing held");
    Ok(out)
}

const KEY: &str = "sk-proj-PLANTED0123456789abcdef";

#[test]
fn a_secret_cut_across_pieces_is_masked_whole() {
    let g = rules(r#"[{"name":"s","detect":["secrets"],"action":"mask","on":"answer"}]"#);
    let (a, b) = KEY.split_at(12);
    let out = through(
        &g,
        &mut Vault::new(),
        &["the key is ", a, b, " and more", ""],
    )
    .unwrap();
    assert_eq!(out.concat(), "the key is [OPENAI_KEY_1] and more");
    assert!(out.iter().all(|p| !p.contains("PLANT")), "{out:?}");
}

#[test]
fn a_secret_cut_across_pieces_blocks_before_any_of_it_passes() {
    let g = rules(r#"[{"name":"s","detect":["secrets"],"on":"both"}]"#);
    let mut w = Window::default();
    let (mut vault, mut verdict) = (Vault::new(), Verdict::default());
    let mut passed = String::new();
    for p in ["use ", "sk-proj-", "PLANTED01", "23456789abcdef", " now"] {
        match w.push(&g, &mut vault, &mut verdict, p, false) {
            Out::Pass(t) => passed.push_str(&t),
            Out::Blocked(k) => {
                assert_eq!(k, 0);
                assert_eq!(passed, "use ");
                return;
            }
        }
    }
    panic!("not blocked: {passed}");
}

#[test]
fn a_cards_groups_are_held_until_the_number_ends() {
    let g = rules(r#"[{"name":"c","detect":["credit_card"],"action":"mask","on":"answer"}]"#);
    let out = through(
        &g,
        &mut Vault::new(),
        &["pay with 4111 ", "1111 ", "1111 11", "11 today", ""],
    )
    .unwrap();
    assert_eq!(out.concat(), "pay with [CREDIT_CARD_1] today");
    assert!(
        out.iter()
            .all(|p| !p.contains("4111") && !p.contains("1111")),
        "{out:?}"
    );
}

#[test]
fn a_placeholder_cut_across_pieces_is_restored() {
    let g = rules(r#"[{"name":"pii","detect":["email"],"action":"mask","restore":true}]"#);
    let mut vault = Vault::new();
    let tree = Json::parse(br#"{"input":"mail ann@example.com"}"#).unwrap();
    let v = g.check(&tree, &["input"], &mut vault);
    assert_eq!(v.edits.len(), 1);
    let out = through(&g, &mut vault, &["I wrote to [EMA", "IL_1", "] today", ""]).unwrap();
    assert_eq!(out.concat(), "I wrote to ann@example.com today");
}

#[test]
fn a_placeholder_the_answer_rules_issued_is_not_found_again() {
    // A glob that would match the placeholder's label.
    let g = rules(
        r#"[{"name":"pii","detect":["email"],"action":"mask","on":"both"},
            {"name":"caps","globs":["*EMAIL*"],"action":"block","on":"answer"}]"#,
    );
    let mut vault = Vault::new();
    let tree = Json::parse(br#"{"input":"mail ann@example.com"}"#).unwrap();
    g.check(&tree, &["input"], &mut vault);
    let out = through(&g, &mut vault, &["echo: mail [EMAIL_1]", ""]).unwrap();
    assert_eq!(out.concat(), "echo: mail [EMAIL_1]");
}

#[test]
fn a_word_passes_once_the_next_one_starts() {
    let g = rules(r#"[{"name":"s","detect":["secrets"],"on":"answer"}]"#);
    let mut w = Window::default();
    let (mut vault, mut verdict) = (Vault::new(), Verdict::default());
    let mut push = |t: &str| match w.push(&g, &mut vault, &mut verdict, t, false) {
        Out::Pass(p) => p,
        Out::Blocked(_) => panic!("blocked"),
    };
    assert_eq!(push("Hello"), "");
    assert_eq!(push(" world"), "Hello ");
    assert_eq!(push(", how"), "world, ");
}

#[test]
fn what_is_held_is_bounded() {
    let g = rules(r#"[{"name":"s","detect":["secrets"],"action":"mask","on":"answer"}]"#);
    let run = "a".repeat(3 * MAX_HELD);
    let mut w = Window::default();
    let (mut vault, mut verdict) = (Vault::new(), Verdict::default());
    let mut passed = 0;
    for piece in run.as_bytes().chunks(100) {
        let p = std::str::from_utf8(piece).unwrap();
        if let Out::Pass(t) = w.push(&g, &mut vault, &mut verdict, p, false) {
            passed += t.len();
        }
        assert!(w.held() <= MAX_HELD);
    }
    assert_eq!(passed + w.held(), run.len());
}

#[test]
fn the_open_tail_starts_where_a_value_may_go_on() {
    assert_eq!(open_tail("Hello world"), 6);
    assert_eq!(open_tail("Hello world "), 12);
    assert_eq!(open_tail("card 4111 1111 "), 5);
    assert_eq!(open_tail("iban GB82 WEST 1234"), 5);
    assert_eq!(open_tail("api_key: "), 0);
    assert_eq!(open_tail("see [EMAIL_1]"), 13);
    assert_eq!(open_tail(""), 0);
}

use super::*;

const BUILTINS: Rules<'static> = Rules {
    globs: &[],
    builtins: true,
    guarded: None,
};

fn globs(globs: &[&str]) -> Vec<String> {
    globs.iter().map(|g| g.to_string()).collect()
}

fn r(text: &str) -> String {
    redact(text, &BUILTINS).into_owned()
}

#[test]
fn words_a_rule_matches_are_replaced_and_the_rest_kept() {
    let globs = globs(&["secret-*"]);
    let r = Rules {
        globs: &globs,
        builtins: true,
        guarded: None,
    };
    assert_eq!(
        redact("mail bob@example.com, key \"sk-abcdefgh1234\" ok", &r),
        "mail [REDACTED], key \"[REDACTED]\" ok"
    );
    assert_eq!(
        redact("Authorization: Bearer abc.def and secret-42", &r),
        "Authorization: Bearer [REDACTED] and [REDACTED]"
    );
    assert_eq!(redact("api_key=AKIAABCDEFGHIJ", &r), "api_key=[REDACTED]");
    assert_eq!(redact("jwt eyJa.eyJb.sig end", &r), "jwt [REDACTED] end");
    // A short prefix alone, an `@` without a domain: words, not secrets.
    assert!(matches!(redact("sk- @home a@b", &r), Cow::Borrowed(_)));
    let none = Rules {
        globs: &[],
        builtins: false,
        guarded: None,
    };
    assert!(matches!(redact("bob@example.com", &none), Cow::Borrowed(_)));
    // Non-ASCII text around a match.
    assert_eq!(redact("é secret-x ü", &r), "é [REDACTED] ü");
}

#[test]
fn each_kind_of_secret_is_found_by_its_shape() {
    for (text, want) in [
        ("sk-proj-Ab3dEf6hIj", "[REDACTED]"),
        ("sk-ant-api03-abcDEF123_-x", "[REDACTED]"),
        ("sk_live_abcdefgh1", "[REDACTED]"),
        ("pk_live_abcdefgh rk_live_abcdefgh", "[REDACTED] [REDACTED]"),
        (
            "ghp_abcdefgh gho_abcdefgh ghs_abcdefgh ghu_abcdefgh ghr_abcdefgh",
            "[REDACTED] [REDACTED] [REDACTED] [REDACTED] [REDACTED]",
        ),
        ("github_pat_11ABCDEFG_abcdefgh", "[REDACTED]"),
        ("glpat-abcdefgh12", "[REDACTED]"),
        (
            "xoxb-123-456-abc xoxp-1234567 xoxa-12345678 xoxs-12345678 xapp-1-A0-12345",
            "[REDACTED] xoxp-1234567 [REDACTED] [REDACTED] [REDACTED]",
        ),
        ("hf_abcdefghijkl", "[REDACTED]"),
        ("AIzaSyA1234567890", "[REDACTED]"),
        ("ya29.a0AfH6SMB-x_y", "[REDACTED]"),
        ("AKIAIOSFODNN7EXAMPLE.", "[REDACTED]."),
        ("ASIAIOSFODNN7EXAMPLE", "[REDACTED]"),
        // Too short to be an AWS key id, lowercase after the prefix.
        ("AKIAIOSFODNN7 AKIAabcdefghijklmnop", "AKIAIOSFODNN7 AKIAabcdefghijklmnop"),
        ("eyJhbGciOi.eyJzdWIi.c2ln", "[REDACTED]"),
        // `alg: none`: an empty signature.
        ("eyJhbGciOi.eyJzdWIi. next", "[REDACTED] next"),
        ("eyJhbGciOi.eyJzdWIi next", "eyJhbGciOi.eyJzdWIi next"),
        (
            "key: -----BEGIN RSA PRIVATE KEY-----\nMIIEabc\n+/=\n-----END RSA PRIVATE KEY----- after",
            "key: [REDACTED] after",
        ),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1r",
            "[REDACTED]",
        ),
        (
            "-----BEGIN PUBLIC KEY-----\nMIIBIjAN\n-----END PUBLIC KEY-----",
            "-----BEGIN PUBLIC KEY-----\nMIIBIjAN\n-----END PUBLIC KEY-----",
        ),
        ("authorization: bearer abc", "authorization: bearer [REDACTED]"),
        ("BASIC dXNlcjpwYXNz==;", "BASIC [REDACTED];"),
        ("a basic question", "a basic [REDACTED]"),
        ("basically no", "basically no"),
        ("to bob.smith+x@mail.example.com.", "to [REDACTED]."),
        ("@decorator a@b x@y.", "@decorator a@b x@y."),
    ] {
        assert_eq!(r(text), want, "{text}");
    }
}

#[test]
fn a_secret_is_found_wherever_it_starts() {
    for (text, want) in [
        ("api_key:sk-abcdefgh1", "api_key:[REDACTED]"),
        ("x-api-key:sk-ant-abcdefgh", "x-api-key:[REDACTED]"),
        ("token=eyJa.eyJb.c", "token=[REDACTED]"),
        ("(ghp_abcdefgh12)", "([REDACTED])"),
        ("MY_sk-abcdefgh1", "MY_[REDACTED]"),
        ("path/AKIAIOSFODNN7EXAMPLE/x", "path/[REDACTED]/x"),
        ("mailto:bob@example.com", "mailto:[REDACTED]"),
        // Inside a word: not a secret's start.
        (
            "risk-management-plan task_force_abcdefgh",
            "risk-management-plan task_force_abcdefgh",
        ),
    ] {
        assert_eq!(r(text), want, "{text}");
    }
}

#[test]
fn a_value_joined_to_a_credentials_name_is_redacted() {
    for (text, want) in [
        ("api_key:opaque1", "api_key:[REDACTED]"),
        (
            "OPENAI_API_KEY=opaque1 next",
            "OPENAI_API_KEY=[REDACTED] next",
        ),
        ("apikey = 'opaque one'", "apikey = '[REDACTED]'"),
        ("x-api-key: opaque", "x-api-key: [REDACTED]"),
        (
            r#"{"client_secret": "opaque two", "id": 1}"#,
            r#"{"client_secret": "[REDACTED]", "id": 1}"#,
        ),
        ("password=\"p@ss w0rd\"", "password=\"[REDACTED]\""),
        (
            "?access_token=abc&page=2",
            "?access_token=[REDACTED]&page=2",
        ),
        (
            "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG",
            "aws_secret_access_key=[REDACTED]",
        ),
        ("PRIVATE_KEY: x", "PRIVATE_KEY: [REDACTED]"),
        // JSON escaped twice: the quotes are `\"`.
        (
            r#"{\"token\": \"opaque\"}"#,
            r#"{\"token\": \"[REDACTED]\"}"#,
        ),
        // A scheme's credential, and a secret that starts in the value.
        (
            "Authorization: Bearer abc",
            "Authorization: Bearer [REDACTED]",
        ),
        (
            "private_key: -----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
            "private_key: [REDACTED]",
        ),
        // Names that are no credential's, values that are none.
        (
            "max_tokens: 5, tokens=3, key: id",
            "max_tokens: 5, tokens=3, key: id",
        ),
        (r#"{"token": {"a": 1}}"#, r#"{"token": {"a": 1}}"#),
    ] {
        assert_eq!(r(text), want, "{text}");
    }
}

#[test]
fn a_secret_after_an_escape_is_found_and_the_escapes_kept() {
    for (text, want) in [
        // JSON inside a string: escapes written out once.
        (
            r#"{"a":"x\nsk-abcdefgh1\tz"}"#,
            r#"{"a":"x\n[REDACTED]\tz"}"#,
        ),
        (r#"{"a":"\"ghp_abcdefgh1\""}"#, r#"{"a":"\"[REDACTED]\""}"#),
        (
            r#"{"a":"\\AKIAIOSFODNN7EXAMPLE\\"}"#,
            r#"{"a":"\\[REDACTED]\\"}"#,
        ),
        (
            r#"{"a":"\u0020eyJa.eyJb.c\r"}"#,
            r#"{"a":"\u0020[REDACTED]\r"}"#,
        ),
        (
            r#"{"m":"bob\n\tbob@example.com"}"#,
            r#"{"m":"bob\n\t[REDACTED]"}"#,
        ),
        // An escape inside the secret: the raw bytes it came from go.
        (r#"sk-abc\u0064efgh1 x"#, "[REDACTED] x"),
        // Escaped twice: `\n` still written out once decoded.
        (
            r#"{"a":"{\"b\":\"x\\nsk-abcdefgh1\"}"}"#,
            r#"{"a":"{\"b\":\"x\\n[REDACTED]\"}"}"#,
        ),
        (r#"x\\tASIAIOSFODNN7EXAMPLE"#, r#"x\\t[REDACTED]"#),
        // PEM lines joined by escapes.
        (
            r#"{"k":"-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----\n"}"#,
            r#"{"k":"[REDACTED]\n"}"#,
        ),
        // A backslash that only looks like an escape (not JSON).
        (r"C:\token=opaque1", r"C:\token=[REDACTED]"),
        (r"\bearer abc", r"\bearer [REDACTED]"),
    ] {
        assert_eq!(r(text), want, "{text}");
    }
}

#[test]
fn globs_read_decoded_words() {
    let globs = globs(&["tok_*"]);
    let rules = Rules {
        globs: &globs,
        builtins: false,
        guarded: None,
    };
    for (text, want) in [
        ("tok_1 xtok_2", "[REDACTED] xtok_2"),
        ("name:tok_1", "name:[REDACTED]"),
        (
            r#"{"a":"\ntok_1\ttok_2"}"#,
            r#"{"a":"\n[REDACTED]\t[REDACTED]"}"#,
        ),
        (
            r#"{"a":"{\"b\":\"\\ntok_1\"}"}"#,
            r#"{"a":"{\"b\":\"\\n[REDACTED]\"}"}"#,
        ),
        (r"\u0074ok_1", "[REDACTED]"),
    ] {
        assert_eq!(redact(text, &rules), want, "{text}");
    }
}

#[test]
fn a_cut_never_leaves_half_a_word() {
    let t = "send to bob@example.com now";
    assert_eq!(word_boundary(t, 100), t.len());
    assert_eq!(word_boundary(t, 7), 7);
    // Inside the address: back to before it.
    assert_eq!(word_boundary(t, 15), 7);
    assert_eq!(word_boundary("oneword", 3), 0);
    // On a character boundary.
    assert_eq!(word_boundary("aé b", 2), 0);
    assert_eq!(word_boundary("é éé", 3), 2);
    assert_eq!(word_boundary("key:sk-abc", 7), 3);
}

#[test]
fn a_text_cut_short_loses_its_last_word() {
    for (text, end) in [
        ("", 0),
        ("abc", 0),
        ("a sk-ab", 1),
        ("a sk-ab ", 8),
        ("x:eyJa.eyJ", 1),
        ("[REDACTED]", 10),
        ("é ü", 2),
    ] {
        assert_eq!(whole_words(text), end, "{text}");
    }
}

/// Texts built to make a careless scan quadratic: the work of redacting ten
/// times the text, counted in the scans' steps, is about ten times as much,
/// and a bounded number of steps per byte (a quadratic scan does a hundred
/// times as much). Counted, not timed: a loaded machine cannot move it.
#[test]
fn redaction_is_linear_in_the_text() {
    let globs = globs(&["*a*b*c*"]);
    let guarded = crate::guard::Detectors::new(
        crate::guard::Set::ALL,
        &[crate::guard::Custom {
            name: "r",
            globs: &["1*2*".to_string()],
            words: &["aaaa".to_string(), "a a a b".to_string()],
        }],
    )
    .unwrap();
    let rules = Rules {
        globs: &globs,
        builtins: true,
        guarded: Some(&guarded),
    };
    let steps = |text: &str| {
        let mut spent = Budget::unbounded();
        let _ = redact_counted(text, &rules, &mut spent);
        spent.steps()
    };
    for unit in crate::guard::tests::planted::HOSTILE {
        let small = steps(&unit.repeat(40_000 / unit.len()));
        let large = steps(&unit.repeat(400_000 / unit.len()));
        assert!(
            large <= small * 11,
            "{unit:?}: {small} steps for 40 kB, {large} for 400 kB"
        );
        assert!(large <= 400_000 * 200, "{unit:?}: {large} steps for 400 kB");
    }
}

#[test]
fn capture_redacts_cards_and_ibans_too() {
    let rules = Rules {
        globs: &[],
        builtins: true,
        guarded: None,
    };
    assert_eq!(
        redact(
            "card 4111 1111 1111 1111, iban DE89370400440532013000.",
            &rules
        ),
        "card [REDACTED], iban [REDACTED]."
    );
    // Phone numbers and addresses are kept: logs and code are full of them.
    let kept = "call +1 415 555 2671 at 10.0.0.1";
    assert_eq!(redact(kept, &rules), kept);
}

mod props {
    use proptest::prelude::*;

    use super::super::*;
    use crate::fuzz;
    use crate::guard::tests::planted::in_text;

    proptest! {
        #![proptest_config(fuzz::config(512))]

        /// Any secret, after any separator or escape and before anything,
        /// in plain text or JSON escaped once or twice: no 8-byte piece of
        /// it is left, and the text around it is kept.
        #[test]
        fn no_secret_survives((s, raw) in in_text()) {
            let out = super::r(&raw);
            prop_assert!(s.leak(&out).is_none(), "{:?} left in {out:?} of {raw:?}", s.leak(&out));
            prop_assert!(out.contains(REDACTED), "{out:?}");
        }

        /// Arbitrary text with any rules: no panic, a text without a match
        /// borrowed as it is, and what is kept of it kept in order.
        #[test]
        fn any_text_is_redacted_without_panic(text in ".{0,200}", esc in "[\\\\\"nu0-9a-f]{0,20}", glob in "[a-z*?]{0,6}") {
            let globs = vec![glob];
            let rules = Rules { globs: &globs, builtins: true, guarded: None };
            let text = format!("{esc}{text}{esc}");
            let out = redact(&text, &rules);
            match &out {
                Cow::Borrowed(b) => prop_assert_eq!(*b, text.as_str()),
                Cow::Owned(o) => prop_assert!(o.contains(REDACTED)),
            }
            let _ = whole_words(&out);
            let _ = word_boundary(&out, out.len() / 2);
        }
    }
}

pub(crate) use crate::guard::tests::planted::{after, before, escaped, filler, secret, Secret};

//! Secrets planted in text by the property tests of every reader of
//! prompts: one of each kind the built-in detectors know, and what may
//! stand around it.

use proptest::prelude::*;

/// Texts that, repeated, make a careless scan quadratic: a detector's
/// start over and over, each try failing late.
pub(crate) const HOSTILE: &[&str] = &[
    "token:",
    "token=\"",
    "eyJ-",
    "eyJa.",
    "a@",
    "a.a@b",
    "-----BEGIN ",
    "-----BEGIN PRIVATE KEY-----",
    "sk-",
    "AKIA",
    "\\n",
    "\\u00",
    "bearer ",
    "Bearer x:token:",
    "aaaa",
    "a a ",
    "1",
    "1 ",
    "1-",
    "1.",
    "4111 ",
    "+1 ",
    "(",
    "(415) ",
    "0",
    "01 ",
    "DE89 ",
    "DE",
    "1:",
    "::1:",
    "a:",
    "1.1.1.",
    "123-45-",
];

/// A secret of one kind the built-ins know, and its random runs: no
/// 8-byte piece of a run may survive redaction.
#[derive(Debug, Clone)]
pub(crate) struct Secret {
    pub text: String,
    pub runs: Vec<String>,
}

impl Secret {
    /// An 8-byte piece of a run found in `out`.
    pub(crate) fn leak(&self, out: &str) -> Option<String> {
        self.runs.iter().find_map(|run| {
            run.as_bytes()
                .windows(8)
                .filter_map(|w| std::str::from_utf8(w).ok())
                .find(|w| out.contains(w))
                .map(str::to_string)
        })
    }
}

fn run(alphabet: &'static str, min: usize, max: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("[{alphabet}]{{{min},{max}}}")).unwrap()
}

const ALNUM: &str = "A-Za-z0-9";

/// Any secret of each kind.
pub(crate) fn secret() -> impl Strategy<Value = Secret> {
    let one = |prefixes: &'static [&'static str], alphabet: &'static str, min| {
        (prop::sample::select(prefixes), run(alphabet, min, 40)).prop_map(|(p, r)| Secret {
            text: format!("{p}{r}"),
            runs: vec![r],
        })
    };
    let jwt = (
        run(ALNUM, 8, 30),
        run(ALNUM, 8, 30),
        prop::option::of(run("A-Za-z0-9_\\-", 8, 40)),
    )
        .prop_map(|(h, p, s)| Secret {
            text: format!("eyJ{h}.eyJ{p}.{}", s.clone().unwrap_or_default()),
            runs: [Some(h), Some(p), s].into_iter().flatten().collect(),
        });
    let pem = (
        prop::sample::select(
            &[
                "RSA PRIVATE KEY",
                "PRIVATE KEY",
                "EC PRIVATE KEY",
                "OPENSSH PRIVATE KEY",
                "ENCRYPTED PRIVATE KEY",
            ][..],
        ),
        prop::collection::vec(run(ALNUM, 8, 64), 1..4),
        any::<bool>(),
    )
        .prop_map(|(label, lines, end)| {
            let mut text = format!("-----BEGIN {label}-----\n{}", lines.join("\n"));
            if end {
                text.push_str(&format!("\n-----END {label}-----"));
            }
            Secret { text, runs: lines }
        });
    let scheme = (
        prop::sample::select(&["Bearer", "bearer", "BEARER", "Basic", "basic"][..]),
        prop::sample::select(&[" ", "  ", "\t"][..]),
        run("A-Za-z0-9._~+/\\-", 8, 40),
        prop::sample::select(&["", "=", "=="][..]),
    )
        .prop_map(|(s, space, cred, pad)| Secret {
            text: format!("{s}{space}{cred}{pad}"),
            runs: vec![cred],
        });
    let named = (
        prop::sample::select(
            &[
                "api_key",
                "apikey",
                "api-key",
                "x-api-key",
                "X-Api-Key",
                "OPENAI_API_KEY",
                "token",
                "access_token",
                "auth_token",
                "GITHUB_TOKEN",
                "secret",
                "client_secret",
                "password",
                "passwd",
                "secret_access_key",
                "aws_secret_access_key",
                "private_key",
                "authorization",
            ][..],
        ),
        prop::sample::select(&[":", "=", ": ", " = ", "\":\"", "\": \"", "='", ":`"][..]),
        run(ALNUM, 1, 40),
    )
        .prop_map(|(name, join, value)| {
            let close = match join.chars().last() {
                Some(q @ ('"' | '\'' | '`')) => q.to_string(),
                _ => String::new(),
            };
            let open = if join.starts_with('"') { "\"" } else { "" };
            let runs = if value.len() >= 8 {
                vec![value.clone()]
            } else {
                vec![]
            };
            Secret {
                text: format!("{open}{name}{join}{value}{close}"),
                runs,
            }
        });
    prop_oneof![
        one(
            &[
                "sk-",
                "sk-proj-",
                "sk-ant-api03-",
                "sk_live_",
                "sk_test_",
                "pk_live_",
                "rk_live_"
            ],
            "A-Za-z0-9_\\-",
            8
        ),
        one(
            &["ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_11A_"],
            "A-Za-z0-9_",
            8
        ),
        one(&["glpat-", "hf_", "AIza", "ya29."], "A-Za-z0-9_\\-", 8),
        one(
            &["xoxb-1234-", "xoxp-99-", "xoxa-2-", "xoxs-", "xapp-1-A0-"],
            "A-Za-z0-9\\-",
            8
        ),
        one(&["AKIA", "ASIA"], "A-Z0-9", 16),
        jwt,
        pem,
        scheme,
        named,
    ]
}

/// What may stand before a secret: a separator or an escape, never a
/// letter, digit or a character a key holds.
pub(crate) fn before() -> impl Strategy<Value = &'static str> {
    prop::sample::select(
        &[
            " ", "\n", "\t", "\r\n", "\"", "'", "`", "\\", "(", "[", "{", "<", ",", ";", ":", "=",
            "|", "/", ">", "\\n", "\\t", "\\u0020", "\u{a0}", "é ",
        ][..],
    )
}

/// What may follow a secret: anything that ends it, or nothing.
pub(crate) fn after() -> impl Strategy<Value = &'static str> {
    prop::sample::select(
        &[
            "", " ", "\n", "\t", "\"", "'", "\\", ",", ";", ")", "]", "}", ".", "!", "?", ":",
            "\\n", "\\\"", "é",
        ][..],
    )
}

/// Text around a secret.
pub(crate) fn filler() -> impl Strategy<Value = String> {
    run("a-zA-Z0-9 .,:;()\"'\\\\é\\-\n", 0, 24)
}

/// `text` as a JSON string `depth` times over (the string of a JSON
/// document that is itself a string…), without the outer quotes: what a
/// capture hands the redaction for a tool's arguments.
pub(crate) fn escaped(text: &str, depth: usize) -> String {
    let mut t = text.to_string();
    for _ in 0..depth {
        let quoted = serde_json::to_string(&serde_json::json!({ "v": t })).unwrap();
        t = quoted;
    }
    t
}

/// Any secret in text: at its start, or after any separator or escape, and
/// before anything, in plain text or JSON escaped once or twice.
pub(crate) fn in_text() -> impl Strategy<Value = (Secret, String)> {
    (
        secret(),
        filler(),
        before(),
        after(),
        filler(),
        0usize..3,
        any::<bool>(),
    )
        .prop_map(|(s, head, before, after, tail, depth, at_start)| {
            let text = if at_start {
                format!("{}{after}{tail}", s.text)
            } else {
                format!("{head}{before}{}{after}{tail}", s.text)
            };
            let raw = escaped(&text, depth);
            (s, raw)
        })
}

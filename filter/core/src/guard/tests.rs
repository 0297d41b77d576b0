use std::borrow::Cow;

use super::*;

pub(crate) mod planted;

/// Detectors of `set` and no rule.
fn builtins(set: Set) -> Detectors {
    Detectors::new(set, &[]).unwrap()
}

/// What `d` finds in `text`: each finding's name and value.
fn found(d: &Detectors, text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    d.scan(text, &mut Budget::unbounded(), &mut out);
    out.iter()
        .map(|f| {
            let value = text.get(f.range.clone()).expect("a range of the text");
            (d.name(f.detector).to_string(), value.to_string())
        })
        .collect()
}

/// The values of `id` in `text`.
fn values(id: DetectorId, text: &str) -> Vec<String> {
    found(&builtins(Set::NONE.with(id)), text)
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

/// `digits` with the Luhn check digit that makes it valid after it.
fn with_check(digits: &str) -> String {
    let sum: u32 = digits
        .chars()
        .rev()
        .enumerate()
        .map(|(k, c)| {
            let d = c.to_digit(10).unwrap();
            match k % 2 {
                0 if d > 4 => d * 2 - 9,
                0 => d * 2,
                _ => d,
            }
        })
        .sum();
    format!("{digits}{}", (10 - sum % 10) % 10)
}

/// Asserts `id` finds each value of `hits` alone in a sentence, and
/// nothing in `misses`.
fn check(id: DetectorId, hits: &[&str], misses: &[&str]) {
    for hit in hits {
        let text = format!("see {hit}, then");
        assert_eq!(values(id, &text), [*hit], "{} in {text:?}", id.name());
    }
    for miss in misses {
        let text = format!("see {miss}, then");
        assert_eq!(
            values(id, &text),
            Vec::<String>::new(),
            "{} in {text:?}",
            id.name()
        );
    }
}

#[test]
fn names_are_stable_and_unique() {
    let names: Vec<&str> = DetectorId::ALL.iter().map(|d| d.name()).collect();
    assert_eq!(names.len(), 22);
    for (k, name) in names.iter().enumerate() {
        assert!(!names[..k].contains(name), "{name}");
        assert_eq!(DetectorId::from_name(name), Some(DetectorId::ALL[k]));
    }
    assert_eq!(DetectorId::from_name("nope"), None);
    assert!(DetectorId::Jwt.is_secret() && !DetectorId::Email.is_secret());
    assert_eq!(Set::SECRETS.iter().count(), 15);
    assert_eq!(Set::PERSONAL.iter().count(), 7);
    assert_eq!(Set::ALL.iter().collect::<Set>(), Set::ALL);
    assert!(Set::CAPTURE.has(DetectorId::CreditCard) && !Set::CAPTURE.has(DetectorId::Phone));
}

#[test]
fn each_secret_is_named_by_its_detector() {
    let d = builtins(Set::SECRETS);
    let one = |text: &str, name: &str, value: &str| {
        let want = [(name.to_string(), value.to_string())];
        assert_eq!(found(&d, text), want, "{text}");
    };
    for (name, value) in [
        ("openai_key", "sk-proj-Ab3dEf6hIj"),
        ("openai_key", "sk-abcdefgh12"),
        ("anthropic_key", "sk-ant-api03-abcDEF123_-x"),
        // Too short for Anthropic's prefix, long enough for `sk-`'s.
        ("anthropic_key", "sk-ant-abcd"),
        ("stripe_key", "sk_live_abcdefgh1"),
        ("stripe_key", "rk_live_abcdefgh"),
        ("github_token", "ghp_abcdefgh12"),
        ("github_token", "github_pat_11ABCDEFG_abcdefgh"),
        ("gitlab_token", "glpat-abcdefgh12"),
        ("slack_token", "xoxb-123-456-abc"),
        ("slack_token", "xoxe-1-abcdefgh"),
        ("slack_token", "xapp-1-A0-12345"),
        ("huggingface_token", "hf_abcdefghijkl"),
        ("google_api_key", "AIzaSyA1234567890"),
        ("google_oauth_token", "ya29.a0AfH6SMB-x_y"),
        ("aws_access_key_id", "AKIAIOSFODNN7EXAMPLE"),
        ("aws_access_key_id", "ASIAIOSFODNN7EXAMPLE"),
        ("jwt", "eyJhbGciOi.eyJzdWIi.c2ln"),
    ] {
        one(&format!("k {value}. ok"), name, value);
    }
    let pem = "-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----";
    one(&format!("{pem} x"), "private_key", pem);
    one("Authorization: Bearer abc.def", "bearer_token", "abc.def");
    one("Bearer tokenised", "bearer_token", "tokenised");
    // A word of prose after the scheme is none.
    for text in [
        "send it as a Bearer token.",
        "Basic authentication, or a bearer TOKEN?",
        "the Basic auth: scheme",
    ] {
        assert_eq!(found(&d, text), [], "{text}");
    }
    one("BASIC dXNlcjpwYXNz==;", "basic_auth", "dXNlcjpwYXNz==");
    one("password=\"p@ss w0rd\"", "named_credential", "p@ss w0rd");
    one("KeyToken=a1b2c3d4", "named_credential", "a1b2c3d4");
    // A .NET assembly's public key token is no credential.
    assert_eq!(
        found(&d, "Culture=neutral, PublicKeyToken=cc7b13ffcd2ddd51"),
        []
    );
    // A short tail, an unknown Slack kind, lowercase after AWS's prefix.
    for text in [
        "xoxp-1234567",
        "xox1-abcdefgh",
        "AKIAabcdefghijklmnop",
        "sk- x",
    ] {
        assert_eq!(found(&d, text), [], "{text}");
    }
}

#[test]
fn one_value_may_be_two_things() {
    let d = builtins(Set::ALL);
    let card = "4111111111111111";
    assert_eq!(
        found(&d, &format!("password={card}")),
        [
            ("named_credential".to_string(), card.to_string()),
            ("credit_card".to_string(), card.to_string())
        ]
    );
}

#[test]
fn emails() {
    check(
        DetectorId::Email,
        &["bob@example.com", "bob.smith+x@mail.example.co.uk"],
        &[
            "@decorator",
            "a@b",
            "x@y.",
            "react@18.3.1",
            "left-pad@1.3.0",
        ],
    );
    check(
        DetectorId::Email,
        &["ops@mail.example.io", "x@10.example.com"],
        &[],
    );
}

#[test]
fn cards_are_an_issuers_numbers_that_pass_luhn() {
    let visa19 = with_check("411111111111111111");
    let visa17 = with_check("4111111111111111");
    check(
        DetectorId::CreditCard,
        &[
            "4111111111111111",
            "4111 1111 1111 1111",
            "4111-1111-1111-1111",
            "4222 222 222 222",
            &visa19,
            "378282246310005",
            "3782 822463 10005",
            "5555555555554444",
            "2223003122003222",
            "6011111111111117",
            "3566002020360505",
            "30569309025904",
            "6200000000000005",
            "2200000000000004",
            "5018000000000009",
        ],
        &[
            // Luhn fails.
            "4111111111111112",
            "4111 1111 1111 1112",
            // Luhn holds, but no issuer, or not its length.
            "1234567812345670",
            &visa17,
            "5555 5555 5555 4444 0",
            // Groups no card is written in; separators mixed.
            "41 11 1111 1111 1111",
            "4111 1111-1111 1111",
            // 13 digits alone: an EAN-13 barcode's length (a German one,
            // Luhn-valid; a 13-digit Visa number, long out of issue).
            "4006381333932",
            "4222222222222",
            // Inside a longer number, a decimal, an identifier.
            "41111111111111111111",
            "12 4111 1111 1111 1111",
            "0.4111111111111111",
            "4111111111111111.5",
            "4111111111111111x",
            "x4111111111111111",
        ],
    );
}

#[test]
fn ibans_have_their_countrys_length_and_check_digits() {
    check(
        DetectorId::Iban,
        &[
            "DE89370400440532013000",
            "DE89 3704 0044 0532 0130 00",
            "GB29NWBK60161331926819",
            "FR1420041010050500013M02606",
            "NL91ABNA0417164300",
            "NO9386011117947",
            "BE68 5390 0754 7034",
        ],
        &[
            // Check digits wrong, a character short, no such country.
            "DE88370400440532013000",
            "DE8937040044053201300",
            "XX89370400440532013000",
            // Lowercase, groups mixed, going on.
            "de89370400440532013000",
            "DE89 3704 0044 0532013000",
            "DE893704004405320130001",
            "DE89 3704 0044 0532 0130 00 12",
        ],
    );
    // Followed by a word: still one.
    assert_eq!(
        values(
            DetectorId::Iban,
            "IBAN DE89 3704 0044 0532 0130 00 BIC COBADEFF"
        ),
        ["DE89 3704 0044 0532 0130 00"]
    );
}

/// The example of every country in the IBAN registry (release 100).
const REGISTRY_EXAMPLES: &[&str] = &[
    "AD1200012030200359100100",
    "AE070331234567890123456",
    "AL47212110090000000235698741",
    "AT611904300234573201",
    "AZ21NABZ00000000137010001944",
    "BA391290079401028494",
    "BE68539007547034",
    "BG80BNBG96611020345678",
    "BH67BMAG00001299123456",
    "BI4210000100010000332045181",
    "BR1800360305000010009795493C1",
    "BY13NBRB3600900000002Z00AB00",
    "CH9300762011623852957",
    "CR05015202001026284066",
    "CY17002001280000001200527600",
    "CZ6508000000192000145399",
    "DE89370400440532013000",
    "DJ2100010000000154000100186",
    "DK5000400440116243",
    "DO28BAGR00000001212453611324",
    "EE382200221020145685",
    "EG380019000500000000263180002",
    "ES9121000418450200051332",
    "FI2112345600000785",
    "FK88SC123456789012",
    "FO6264600001631634",
    "FR1420041010050500013M02606",
    "GB29NWBK60161331926819",
    "GE29NB0000000101904917",
    "GI75NWBK000000007099453",
    "GL8964710001000206",
    "GR1601101250000000012300695",
    "GT82TRAJ01020000001210029690",
    "HN88CABF00000000000250005469",
    "HR1210010051863000160",
    "HU42117730161111101800000000",
    "IE29AIBK93115212345678",
    "IL620108000000099999999",
    "IQ98NBIQ850123456789012",
    "IS140159260076545510730339",
    "IT60X0542811101000000123456",
    "JO94CBJO0010000000000131000302",
    "KW81CBKU0000000000001234560101",
    "KZ86125KZT5004100100",
    "LB62099900000001001901229114",
    "LC55HEMM000100010012001200023015",
    "LI21088100002324013AA",
    "LT121000011101001000",
    "LU280019400644750000",
    "LV80BANK0000435195001",
    "LY83002048000020100120361",
    "MC5811222000010123456789030",
    "MD24AG000225100013104168",
    "ME25505000012345678951",
    "MK07250120000058984",
    "MN121234123456789123",
    "MR1300020001010000123456753",
    "MT84MALT011000012345MTLCAST001S",
    "MU17BOMM0101101030300200000MUR",
    "NI45BAPR00000013000003558124",
    "NL91ABNA0417164300",
    "NO9386011117947",
    "OM810180000001299123456",
    "PK36SCBL0000001123456702",
    "PL61109010140000071219812874",
    "PS92PALS000000000400123456702",
    "PT50000201231234567890154",
    "QA58DOHB00001234567890ABCDEFG",
    "RO49AAAA1B31007593840000",
    "RS35260005601001611379",
    "RU0304452522540817810538091310419",
    "SA0380000000608010167519",
    "SC18SSCB11010000000000001497USD",
    "SD2129010501234001",
    "SE4550000000058398257466",
    "SI56263300012039086",
    "SK3112000000198742637541",
    "SM86U0322509800000000270100",
    "SO211000001001000100141",
    "ST23000100010051845310146",
    "SV62CENR00000000000000700025",
    "TL380080012345678910157",
    "TN5910006035183598478831",
    "TR330006100519786457841326",
    "UA213223130000026007233566001",
    "VA59001123000012345678",
    "VG96VPVG0000012345678901",
    "XK051212012345678906",
    "YE15CBYE0001018861234567891234",
];

#[test]
fn every_registry_countrys_example_iban_is_found() {
    assert_eq!(REGISTRY_EXAMPLES.len(), 89);
    for example in REGISTRY_EXAMPLES {
        assert_eq!(
            values(DetectorId::Iban, &format!("pay to {example} today")),
            [*example],
            "{example}"
        );
    }
}

#[test]
fn ssns_have_a_valid_area_group_and_serial() {
    check(
        DetectorId::UsSsn,
        &["123-45-6789", "078-05-1120", "899-99-9999"],
        &[
            "000-12-3456",
            "666-12-3456",
            "900-12-3456",
            "123-00-4567",
            "123-45-0000",
            "123-45-67890",
            "1123-45-6789",
            "123 45 6789",
            "123456789",
            "123-45-6789-1",
        ],
    );
}

#[test]
fn phone_numbers_need_a_plus_or_a_format() {
    check(
        DetectorId::Phone,
        &[
            "+1 415 555 2671",
            "+14155552671",
            "+44 20 7946 0958",
            "+1 (415) 555-2671",
            "+44 (0)20 7946 0958",
            "+49-30-1234567",
            "(415) 555-2671",
            "(415)555-2671",
            "415-555-2671",
            "415.555.2671",
            "1-415-555-2671",
            "020 7946 0958",
            "07700 900123",
            "06-12345678",
            "01 23 45 67 89",
            "030/12345678",
        ],
        &[
            // Plain runs of digits, too short or too long.
            "4155552671",
            "+12345",
            "+1234567890123456",
            "+0 415 555 2671",
            // Area or exchange codes starting at 0 or 1; a line too long.
            "123-456-7890",
            "415-155-2671",
            "415-555-26711",
            "415 555 2671",
            "415-555.2671",
            // Dates, times, decimals, versions.
            "2023-05-12",
            "12:30:45",
            "3.1415926535",
            "01.02.2023",
            "0123456789",
        ],
    );
}

#[test]
fn ip_addresses_have_valid_octets_and_groups() {
    check(
        DetectorId::Ipv4,
        &["192.168.0.1", "8.8.8.8", "0.0.0.0", "255.255.255.255"],
        &[
            "256.1.1.1",
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "1.2.3.4a",
            "v1.2.3.4",
            "1.2.3.1000",
        ],
    );
    // A port or a prefix length after it, the end of a sentence; a
    // dotted quad in prose other than after `version` is one (see the
    // module's doc).
    for (text, want) in [
        ("10.0.0.1:8080", "10.0.0.1"),
        ("10.0.0.0/8", "10.0.0.0"),
        ("at 8.8.8.8.", "8.8.8.8"),
        ("release 1.2.3.4 of", "1.2.3.4"),
        ("conversion 10.0.0.1", "10.0.0.1"),
    ] {
        assert_eq!(values(DetectorId::Ipv4, text), [want], "{text}");
    }
    // Right after the word `version`, a version.
    for text in [
        "version 1.2.3.4 of",
        "System.Text.Json, Version=6.0.0.0, Culture=neutral",
        r#"{"version": "10.0.0.1"}"#,
        r#"{\"version\": \"10.0.0.1\"}"#,
        "AssemblyFileVersion: 4.0.0.0",
    ] {
        assert_eq!(values(DetectorId::Ipv4, text), [""; 0], "{text}");
    }
    check(
        DetectorId::Ipv6,
        &[
            "2001:db8::1",
            "fe80::1ff:fe23:4567:890a",
            "::1",
            "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
            "::ffff:192.0.2.128",
            "2001:DB8:0:0:8:800:200C:417A",
        ],
        &[
            "12:30:45",
            "dead::beef",
            "a::b",
            "std::vec::Vec",
            "1::2::3",
            "00:1a:2b:3c:4d:5e",
            "12345::1",
            "1:2:3:4:5:6:7:8:9",
            "2001:db8::1::",
            "::",
            // Python's slices: with `::`, an address has a group of three
            // digits or more, an IPv4 tail, or is `::1`.
            "xs[::2]",
            "xs[1::2]",
            "m[5::10]",
            "::2",
        ],
    );
    check(
        DetectorId::Ipv6,
        &["ff02::1", "64:ff9b::192.0.2.33", "::1:2:abc"],
        &[],
    );
    assert_eq!(
        values(DetectorId::Ipv6, "[2001:db8::1]:443"),
        ["2001:db8::1"]
    );
}

#[test]
fn values_in_json_escaped_text_are_found_and_ranged_in_the_raw_text() {
    let d = builtins(Set::ALL);
    for (raw, name, value) in [
        (
            r#"{"a":"x\nbob@example.com\t"}"#,
            "email",
            "bob@example.com",
        ),
        (
            r#"{"a":"\"4111 1111 1111 1111\""}"#,
            "credit_card",
            "4111 1111 1111 1111",
        ),
        (r#"{"a":"x\n192.168.0.1"}"#, "ipv4", "192.168.0.1"),
        // An escape inside the value: its raw bytes.
        (
            r#"bob\u0040example.com"#,
            "email",
            r#"bob\u0040example.com"#,
        ),
        (
            r#"\u0041KIAIOSFODNN7EXAMPLE"#,
            "aws_access_key_id",
            r#"\u0041KIAIOSFODNN7EXAMPLE"#,
        ),
    ] {
        assert_eq!(
            found(&d, raw),
            [(name.to_string(), value.to_string())],
            "{raw}"
        );
    }
}

fn rules() -> Detectors {
    let globs = ["tok_*".to_string()];
    let words = [
        "Project Falcon".to_string(),
        "ban".to_string(),
        "new york".to_string(),
        "york city".to_string(),
        "  Müller ".to_string(),
        "ОСОБАЯ".to_string(),
        "机密".to_string(),
    ];
    let also = ["ban".to_string()];
    Detectors::new(
        Set::NONE,
        &[
            Custom {
                name: "codenames",
                globs: &globs,
                words: &words,
            },
            Custom {
                name: "banned",
                globs: &[],
                words: &also,
            },
        ],
    )
    .unwrap()
}

#[test]
fn deny_lists_find_whole_words_in_any_case() {
    let d = rules();
    let pairs = |text: &str| -> Vec<(String, String)> { found(&d, text) };
    let one = |name: &str, v: &str| (name.to_string(), v.to_string());
    assert_eq!(
        pairs("about PROJECT falcon."),
        [one("codenames", "PROJECT falcon")]
    );
    // In two rules: one finding each.
    assert_eq!(
        pairs("a Ban here"),
        [one("codenames", "Ban"), one("banned", "Ban")]
    );
    // Inside a word, or with an identifier's `_`: none.
    assert_eq!(pairs("banana urban ban_list"), []);
    // Overlapping phrases: both.
    assert_eq!(
        pairs("in New York City"),
        [one("codenames", "New York"), one("codenames", "York City")]
    );
    // Folded beyond ASCII; trimmed when configured.
    assert_eq!(pairs("herr MÜLLER."), [one("codenames", "MÜLLER")]);
    assert_eq!(pairs("это особая папка"), [one("codenames", "особая")]);
    // A script without spaces: anywhere.
    assert_eq!(pairs("这是机密文件"), [one("codenames", "机密")]);
    // Decoded, and a glob pattern.
    assert_eq!(
        pairs(r#"{"a":"x\nProject\u0020Falcon tok_1"}"#),
        [
            one("codenames", r#"Project\u0020Falcon"#),
            one("codenames", "tok_1")
        ]
    );
}

#[test]
fn rules_are_checked_when_built() {
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let bad = |rules: &[Custom<'_>]| Detectors::new(Set::ALL, rules).unwrap_err();
    let rule = |name, globs, words| Custom { name, globs, words };
    let secret = words(&["\u{7}topsecret"]);
    for (rules, field) in [
        (vec![rule("a b", &[], &[])], "rules[0].name"),
        (vec![rule("email", &[], &[])], "rules[0].name"),
        (
            vec![rule("x", &[], &[]), rule("x", &[], &[])],
            "rules[1].name",
        ),
        (vec![rule("x", &[], &secret)], "rules[0].words[0]"),
    ] {
        let e = bad(&rules);
        assert_eq!(e.field, field);
        assert!(!e.message.contains("topsecret"), "{}", e.message);
    }
    let globs = words(&["*"]);
    assert_eq!(bad(&[rule("x", &globs, &[])]).field, "rules[0].globs[0]");
    let blank = words(&["ok", "  "]);
    assert_eq!(bad(&[rule("x", &[], &blank)]).field, "rules[0].words[1]");
    let long = words(&[&"a".repeat(129)]);
    assert_eq!(bad(&[rule("x", &[], &long)]).field, "rules[0].words[0]");
    let many = words(&vec!["w"; 1025]);
    assert_eq!(bad(&[rule("x", &[], &many)]).field, "rules[].words");
    let heavy = words(&vec![&"w".repeat(100) as &str; 200]);
    assert_eq!(bad(&[rule("x", &[], &heavy)]).field, "rules[].words");
    let names: Vec<String> = (0..33).map(|k| format!("r{k}")).collect();
    let lots: Vec<Custom<'_>> = names.iter().map(|n| rule(n, &[], &[])).collect();
    assert_eq!(bad(&lots).field, "rules");
}

#[test]
fn nothing_found_is_ever_in_debug_output() {
    let d = rules();
    let text = "mail bob@example.com key sk-abcdefgh12 card 4111111111111111 Project Falcon";
    let all = Detectors::new(
        Set::ALL,
        &[Custom {
            name: "codenames",
            globs: &[],
            words: &["Project Falcon".to_string()],
        }],
    )
    .unwrap();
    let mut out = Vec::new();
    let mut budget = Budget::unbounded();
    all.scan(text, &mut budget, &mut out);
    assert_eq!(out.len(), 4);
    let mut vault = Vault::new();
    let masked = vault.mask(text, &out, &all);
    let debug = format!("{out:?} {budget:?} {vault:?} {d:?} {all:?}");
    for value in ["bob@", "sk-abc", "4111", "Falcon"] {
        assert!(!debug.contains(value), "{value} in {debug}");
        assert!(!masked.contains(value), "{value} in {masked}");
    }
}

#[test]
fn the_budget_bounds_bytes_and_findings() {
    let d = builtins(Set::ALL);
    let text = "a@example.com ".repeat(10);
    // Bytes: the first 25 bytes only, the second address cut short.
    let mut b = Budget::new(25, 100);
    let mut out = Vec::new();
    d.scan(&text, &mut b, &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].range, 14..25);
    assert!(b.truncated() && b.bytes_left() == 0);
    // Nothing more is read once it is spent.
    d.scan("b@example.com", &mut b, &mut out);
    assert_eq!(out.len(), 2);
    // Findings.
    let mut b = Budget::new(1 << 20, 3);
    let mut out = Vec::new();
    d.scan(&text, &mut b, &mut out);
    assert_eq!(out.len(), 3);
    assert!(b.truncated());
    // A text that decodes is read twice, so half as far.
    let mut b = Budget::new(40, 100);
    let mut out = Vec::new();
    d.scan(&format!("\\n{text}"), &mut b, &mut out);
    assert_eq!(out.len(), 1);
    assert!(b.truncated());
    // Within it: not truncated, the steps counted.
    let mut b = Budget::new(1 << 20, 100);
    d.scan(&text, &mut b, &mut Vec::new());
    assert!(!b.truncated() && b.steps() > text.len());
    assert_eq!(b.bytes_left(), (1 << 20) - text.len());
}

#[test]
fn masking_names_each_value_and_restoring_gives_it_back() {
    let d = builtins(Set::ALL);
    let text = "to bob@example.com, cc ann@example.com, again bob@example.com; \
                card 4111 1111 1111 1111";
    let mut out = Vec::new();
    d.scan(text, &mut Budget::unbounded(), &mut out);
    let mut vault = Vault::new();
    let masked = vault.mask(text, &out, &d).into_owned();
    assert_eq!(
        masked,
        "to [EMAIL_1], cc [EMAIL_2], again [EMAIL_1]; card [CREDIT_CARD_3]"
    );
    assert_eq!(vault.len(), 3);
    // A second text of the same call: the same placeholders.
    let mut more = Vec::new();
    d.scan("from ann@example.com", &mut Budget::unbounded(), &mut more);
    assert_eq!(
        vault.mask("from ann@example.com", &more, &d),
        "from [EMAIL_2]"
    );
    assert_eq!(vault.restore(&masked, usize::MAX), text);
    let answer = "I wrote to [EMAIL_2] and [EMAIL_9] and [EMAIL_1 and [CREDIT_CARD_1].";
    assert_eq!(
        vault.restore(answer, usize::MAX),
        "I wrote to ann@example.com and [EMAIL_9] and [EMAIL_1 and [CREDIT_CARD_1]."
    );
    // Within a length: a value that does not fit stays masked.
    assert_eq!(
        vault.restore("[EMAIL_1][EMAIL_1]", 25),
        "bob@example.com[EMAIL_1]"
    );
    assert!(matches!(vault.restore("no mask", 100), Cow::Borrowed(_)));
    assert!(matches!(vault.mask("plain", &[], &d), Cow::Borrowed(_)));
}

#[test]
fn overlapping_findings_are_masked_as_one_named_by_the_first() {
    let d = Detectors::new(
        Set::ALL,
        &[Custom {
            name: "test-cards",
            globs: &["4111*".to_string()],
            words: &[],
        }],
    )
    .unwrap();
    let text = "password=4111111111111111 ok";
    let mut out = Vec::new();
    d.scan(text, &mut Budget::unbounded(), &mut out);
    assert_eq!(out.len(), 3);
    let mut vault = Vault::new();
    assert_eq!(
        vault.mask(text, &out, &d),
        "password=[NAMED_CREDENTIAL_1] ok"
    );
    // A rule's name is its label.
    let only = [out[2].clone()];
    assert_eq!(d.name(only[0].detector), "test-cards");
    assert_eq!(
        vault.mask(text, &only, &d),
        "password=[NAMED_CREDENTIAL_1] ok"
    );
    let mut fresh = Vault::new();
    assert_eq!(fresh.mask(text, &only, &d), "password=[TEST_CARDS_1] ok");
}

#[test]
fn a_full_vault_still_masks() {
    let d = builtins(Set::NONE.with(DetectorId::Email));
    let text: String = (0..300).map(|k| format!("u{k}@example.com ")).collect();
    let mut out = Vec::new();
    d.scan(&text, &mut Budget::unbounded(), &mut out);
    let mut vault = Vault::new();
    let masked = vault.mask(&text, &out, &d);
    assert_eq!(vault.len(), mask::MAX_VALUES);
    assert!(!masked.contains("@example.com"));
    assert!(masked.contains("[EMAIL_256] [EMAIL] "), "{masked}");
    assert!(masked.ends_with("[EMAIL] [EMAIL] "), "{masked}");
    // An unnumbered placeholder is restored to nothing.
    assert_eq!(vault.restore("[EMAIL]", 1000), "[EMAIL]");
}

#[test]
fn a_placeholder_cut_at_the_end_of_a_piece_is_held() {
    assert_eq!(mask::pending("see [EMA"), 4);
    assert_eq!(mask::pending("see [EMAIL_1"), 4);
    assert_eq!(mask::pending("see [EMAIL_1]"), 13);
    assert_eq!(mask::pending("see [a"), 6);
    assert_eq!(mask::pending("["), 0);
    assert_eq!(mask::pending(""), 0);
    let far = format!("[{}", "A".repeat(100));
    assert_eq!(mask::pending(&far), far.len());
}

/// Texts built to make a careless scan quadratic: the steps of ten times
/// the text are about ten times as many, and a bounded number per byte.
#[test]
fn the_scan_is_linear_in_the_text_counted_in_steps() {
    let d = Detectors::new(
        Set::ALL,
        &[Custom {
            name: "r",
            globs: &["*a*b*c*".to_string(), "1*2*".to_string()],
            words: &[
                "aaaa".to_string(),
                "a a a b".to_string(),
                "aaaab".to_string(),
            ],
        }],
    )
    .unwrap();
    let steps = |text: &str| {
        let mut b = Budget::new(usize::MAX, usize::MAX);
        d.scan(text, &mut b, &mut Vec::new());
        b.steps()
    };
    for unit in planted::HOSTILE {
        let small = steps(&unit.repeat(4_000 / unit.len()));
        let large = steps(&unit.repeat(40_000 / unit.len()));
        assert!(
            large <= small * 11,
            "{unit:?}: {small} steps for 4 kB, {large} for 40 kB"
        );
        assert!(large <= 40_000 * 100, "{unit:?}: {large} steps for 40 kB");
    }
}

mod props {
    use proptest::prelude::*;

    use super::planted::{escaped, filler, in_text};
    use super::*;
    use crate::fuzz;

    /// Text of the bytes detectors look at.
    fn noise() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(
            &[
                "0",
                "1",
                "4",
                "9",
                " ",
                "-",
                ".",
                ":",
                "::",
                "+",
                "(",
                ")",
                "/",
                "@",
                "a",
                "F",
                "DE",
                "x",
                "\\",
                "\\n",
                "\\u0040",
                "\"",
                "=",
                "_",
                "é",
                "机",
                "sk-",
                "eyJ",
                "-----BEGIN ",
                "PRIVATE KEY-----",
                "bearer ",
                "token:",
                "4111",
                "1111 ",
                "ban",
                "New York",
                "\n",
            ][..],
        );
        prop::collection::vec(piece, 0..120).prop_map(|p| p.concat())
    }

    fn all() -> Detectors {
        Detectors::new(
            Set::ALL,
            &[Custom {
                name: "r",
                globs: &["*1*".to_string()],
                words: &["ban".to_string(), "new york".to_string()],
            }],
        )
        .unwrap()
    }

    /// A valid value of a personal detector, in one of its formats.
    fn personal() -> impl Strategy<Value = (DetectorId, String)> {
        let card = (
            prop::sample::select(&["4", "51", "2221", "34", "6011", "3528", "62"][..]),
            "[0-9]{20}",
            any::<bool>(),
        )
            .prop_map(|(p, rest, grouped)| {
                let len = match p {
                    "34" => 15,
                    _ => 16,
                };
                let n = with_check(&format!("{p}{rest}")[..len - 1]);
                let text = if grouped && len == 16 {
                    n.as_bytes()
                        .chunks(4)
                        .map(|c| std::str::from_utf8(c).unwrap())
                        .collect::<Vec<_>>()
                        .join(" ")
                } else {
                    n
                };
                (DetectorId::CreditCard, text)
            });
        let iban = ("[0-9]{18}", any::<bool>()).prop_map(|(bban, spaced)| {
            let rearranged = format!("{bban}131400");
            let rem = rearranged
                .bytes()
                .fold(0u32, |r, d| (r * 10 + u32::from(d - b'0')) % 97);
            let text = format!("DE{:02}{bban}", 98 - rem);
            let text = if spaced {
                text.as_bytes()
                    .chunks(4)
                    .map(|c| std::str::from_utf8(c).unwrap())
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                text
            };
            (DetectorId::Iban, text)
        });
        let ssn = (1u32..900, 1u32..100, 1u32..10000)
            .prop_filter("area 666", |(a, _, _)| *a != 666)
            .prop_map(|(a, g, s)| (DetectorId::UsSsn, format!("{a:03}-{g:02}-{s:04}")));
        let ipv4 = any::<[u8; 4]>().prop_map(|o| {
            (
                DetectorId::Ipv4,
                format!("{}.{}.{}.{}", o[0], o[1], o[2], o[3]),
            )
        });
        let ipv6 = any::<[u16; 8]>().prop_map(|g| {
            // The first group in decimal digits: the detector asks for one.
            let first = format!("{}", g[0] % 10_000);
            let rest = g[1..].iter().map(|x| format!("{x:x}"));
            let text = std::iter::once(first)
                .chain(rest)
                .collect::<Vec<_>>()
                .join(":");
            (DetectorId::Ipv6, text)
        });
        let phone = ("[2-9][0-9]{2}", "[2-9][0-9]{2}", "[0-9]{4}")
            .prop_map(|(a, e, l)| (DetectorId::Phone, format!("+1 ({a}) {e}-{l}")));
        let email = ("[a-z][a-z0-9._]{0,10}", "[a-z]{1,10}")
            .prop_map(|(u, h)| (DetectorId::Email, format!("{u}@{h}.example")));
        prop_oneof![card, iban, ssn, ipv4, ipv6, phone, email]
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// Any text scans without panic within the budget: findings are
        /// sorted ranges of the text on character boundaries, no more than
        /// allowed, the bytes read no more than allowed, and a bounded
        /// number of steps per byte read.
        #[test]
        fn any_text_scans_within_the_bound(
            text in prop_oneof![noise(), ".{0,300}"],
            bytes in 0usize..2_000,
            findings in 0usize..40,
        ) {
            let d = all();
            let mut b = Budget::new(bytes, findings);
            let mut out = Vec::new();
            d.scan(&text, &mut b, &mut out);
            prop_assert!(out.len() <= findings);
            let read = bytes - b.bytes_left();
            prop_assert!(read <= bytes);
            prop_assert!(b.steps() <= 100 * read + 100, "{} steps for {read} bytes", b.steps());
            for w in out.windows(2) {
                prop_assert!(w[0].range.start <= w[1].range.start);
            }
            for f in &out {
                prop_assert!(f.range.start < f.range.end && f.range.end <= text.len());
                prop_assert!(text.get(f.range.clone()).is_some());
            }
            if !b.truncated() {
                prop_assert!(read >= text.len());
            }
        }

        /// Masking any findings of any text, then restoring, gives the
        /// text back; and no planted value is left in the masked text.
        #[test]
        fn masking_then_restoring_is_the_identity(
            text in noise(),
            planted in prop::collection::vec((personal(), filler()), 0..4),
            keep in any::<u64>(),
        ) {
            let d = all();
            let mut full = text.clone();
            for ((_, value), fill) in &planted {
                full.push_str(&format!(" x {value} x {fill}"));
            }
            let mut out = Vec::new();
            d.scan(&full, &mut Budget::unbounded(), &mut out);
            // Any of them, as a rule's action would pick; all when values
            // were planted.
            let picked: Vec<Finding> = out
                .iter()
                .enumerate()
                .filter(|(k, _)| !planted.is_empty() || keep >> (k % 64) & 1 == 1)
                .map(|(_, f)| f.clone())
                .collect();
            let mut vault = Vault::new();
            let masked = vault.mask(&full, &picked, &d).into_owned();
            let issued = (1..=vault.len()).any(|n| full.contains(&format!("_{n}]")));
            prop_assume!(!issued);
            prop_assert_eq!(vault.restore(&masked, usize::MAX), full.as_str());
            for ((_, value), _) in &planted {
                prop_assert!(!masked.contains(value.as_str()), "{value:?} in {masked:?}");
            }
        }

        /// Any valid value of a personal detector, after a separator or an
        /// escape and before anything that ends it, plain or JSON escaped:
        /// its detector finds it, whole.
        #[test]
        fn planted_personal_data_is_found(
            (id, value) in personal(),
            head in "[a-z ]{0,10}",
            before in prop::sample::select(&[" ", "\n", "\"", "(", "[", ": ", "=", "\\n", "\\t", "é "][..]),
            after in prop::sample::select(&["", " ", "\n", "\"", ")", "]", ", ", ". ", "\\n", "é"][..]),
            depth in 0usize..3,
        ) {
            let text = escaped(&format!("{head}{before}{value}{after}"), depth);
            let d = builtins(Set::NONE.with(id));
            let mut out = Vec::new();
            d.scan(&text, &mut Budget::unbounded(), &mut out);
            let mut vault = Vault::new();
            let masked = vault.mask(&text, &out, &d);
            prop_assert!(!masked.contains(value.as_str()), "{value:?} left in {masked:?}");
            prop_assert!(!out.is_empty());
        }

        /// Any secret the capture's tests plant, masked: no 8-byte piece
        /// of it is left, and it comes back whole.
        #[test]
        fn planted_secrets_are_masked_and_restored((s, text) in in_text()) {
            let d = builtins(Set::ALL);
            let mut out = Vec::new();
            d.scan(&text, &mut Budget::unbounded(), &mut out);
            let mut vault = Vault::new();
            let masked = vault.mask(&text, &out, &d).into_owned();
            prop_assert!(s.leak(&masked).is_none(), "{:?} left in {masked:?}", s.leak(&masked));
            prop_assume!(!text.contains("_1]"));
            prop_assert_eq!(vault.restore(&masked, usize::MAX), text.as_str());
        }
    }
}

#[test]
fn an_address_after_a_number_and_a_space_is_still_one() {
    // A log line's status code, then its client.
    assert_eq!(
        values(DetectorId::Ipv6, "GET /v1/chat 200 2001:db8::7 12ms"),
        ["2001:db8::7"]
    );
    assert_eq!(
        values(DetectorId::Ipv4, "GET /v1/chat 200 10.4.2.17 12ms"),
        ["10.4.2.17"]
    );
    assert_eq!(values(DetectorId::Ipv6, "3 fe80::1 hops"), ["fe80::1"]);
    // Inside a number still none: after a digit and `.`, `:` or `-`.
    assert!(values(DetectorId::Ipv4, "1.10.0.0.1").is_empty());
    assert!(values(DetectorId::Ipv6, "0.2001:db8::7").is_empty());
    // A card or a phone number after a number and a space: a table's tail.
    assert!(values(DetectorId::CreditCard, "12 4111 1111 1111 1111").is_empty());
    assert!(values(DetectorId::Phone, "7 +14155550123").is_empty());
}

use super::*;

const KEY_A1: &str = "vk-team-a-one";
const KEY_A2: &str = "vk-team-a-two";

fn hex(d: [u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn keys() -> TenantConfig {
    let doc = format!(
        r#"{{"from":"virtual_key","keys":{{"team-a":"{} {}"}}}}"#,
        hex(digest(KEY_A1)),
        hex(digest(KEY_A2))
    );
    TenantConfig::compile(crate::config::read::parse(doc.as_bytes()).unwrap()).unwrap()
}

fn resolve_with(
    cfg: &TenantConfig,
    dialect: Dialect,
    path: &str,
    headers: &[(&str, &str)],
    properties: &[(&str, &[u8])],
) -> Result<Identity, Refusal> {
    let header = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.to_string())
    };
    let property = |p: &[&str]| {
        let joined = p.join(".");
        properties
            .iter()
            .find(|(k, _)| *k == joined)
            .map(|(_, v)| v.to_vec())
    };
    resolve(
        cfg,
        dialect,
        path,
        &Caller {
            header: &header,
            property: &property,
        },
    )
}

#[test]
fn a_digest_is_what_sha256sum_prints() {
    // printf %s abc | sha256sum
    assert_eq!(
        hex(digest("abc")),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn a_virtual_key_names_its_tenant_in_each_apis_header() {
    let cfg = keys();
    for (dialect, path, header, value) in [
        (
            Dialect::Chat,
            "/v1/chat/completions",
            "authorization",
            "Bearer vk-team-a-one",
        ),
        (
            Dialect::Chat,
            "/v1/chat/completions",
            "api-key",
            "vk-team-a-two",
        ),
        (
            Dialect::Messages,
            "/v1/messages",
            "x-api-key",
            "vk-team-a-one",
        ),
        (
            Dialect::Messages,
            "/v1/messages",
            "authorization",
            "bearer  vk-team-a-two ",
        ),
    ] {
        let id = resolve_with(&cfg, dialect, path, &[(header, value)], &[]).unwrap();
        assert_eq!(id.tenant.as_deref(), Some("team-a"), "{header}");
        assert_eq!(id.presented.headers, [header], "{header}");
        assert!(!id.presented.query);
    }
}

#[test]
fn geminis_key_in_the_query_or_its_header() {
    let cfg = keys();
    let path = "/v1beta/models/gemini-2.5-flash:generateContent?alt=json&key=vk-team-a-one";
    let id = resolve_with(&cfg, Dialect::Gemini, path, &[], &[]).unwrap();
    assert_eq!(id.tenant.as_deref(), Some("team-a"));
    assert!(id.presented.query && id.presented.headers.is_empty());
    let plain = "/v1beta/models/gemini-2.5-flash:generateContent";
    let id = resolve_with(
        &cfg,
        Dialect::Gemini,
        plain,
        &[("x-goog-api-key", KEY_A2)],
        &[],
    )
    .unwrap();
    assert_eq!(id.presented.headers, ["x-goog-api-key"]);
    assert!(!id.presented.query);
}

#[test]
fn every_credential_of_the_api_is_taken() {
    let cfg = keys();
    let id = resolve_with(
        &cfg,
        Dialect::Messages,
        "/v1/messages",
        &[
            ("x-api-key", KEY_A1),
            ("authorization", "Bearer vk-team-a-one"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(id.presented.headers, ["x-api-key", "authorization"]);
    // Another value beside it goes too: a client's credential is never
    // the provider's here.
    let id = resolve_with(
        &cfg,
        Dialect::Chat,
        "/v1/chat/completions",
        &[
            ("authorization", "Bearer vk-team-a-one"),
            ("api-key", "other"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(id.presented.headers, ["authorization", "api-key"]);
    // A header of another API is not this one's: left alone.
    let id = resolve_with(
        &cfg,
        Dialect::Chat,
        "/v1/chat/completions",
        &[
            ("authorization", "Bearer vk-team-a-one"),
            ("x-api-key", "other"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(id.presented.headers, ["authorization"]);
}

#[test]
fn a_missing_or_unknown_key_is_refused() {
    let cfg = keys();
    let chat =
        |h: &[(&str, &str)]| resolve_with(&cfg, Dialect::Chat, "/v1/chat/completions", h, &[]);
    assert_eq!(chat(&[]), Err(Refusal::Missing));
    assert_eq!(chat(&[("authorization", "Bearer ")]), Err(Refusal::Missing));
    assert_eq!(
        chat(&[("authorization", "Bearer sk-real")]),
        Err(Refusal::Unknown)
    );
    // A digest sent as the key is not the key.
    let as_digest = format!("Bearer {}", hex(digest(KEY_A1)));
    assert_eq!(
        chat(&[("authorization", &as_digest)]),
        Err(Refusal::Unknown)
    );
    // Anthropic's header on a chat call is not a chat call's credential.
    assert_eq!(chat(&[("x-api-key", KEY_A1)]), Err(Refusal::Missing));
    // The first credential the API reads decides: an unknown one is not
    // rescued by a known one behind it.
    assert_eq!(
        chat(&[("authorization", "Bearer nope"), ("api-key", KEY_A1)]),
        Err(Refusal::Unknown)
    );
    for r in [Refusal::Missing, Refusal::Unknown] {
        assert!(!r.message(Source::VirtualKey).contains("vk-"));
    }
}

#[test]
fn a_jwt_claim_is_the_tenant_and_none_is_refused() {
    let cfg = TenantConfig::compile(
        crate::config::read::parse(br#"{"from":"jwt","claim":"team"}"#).unwrap(),
    )
    .unwrap();
    let at = "metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload.team";
    let jwt = |props: &[(&str, &[u8])]| {
        resolve_with(&cfg, Dialect::Chat, "/v1/chat/completions", &[], props)
    };
    assert_eq!(
        jwt(&[(at, b"payments")]).unwrap().tenant.as_deref(),
        Some("payments")
    );
    assert_eq!(jwt(&[]), Err(Refusal::Missing));
    assert_eq!(jwt(&[(at, b"")]), Err(Refusal::Missing));
    assert_eq!(jwt(&[(at, b"a\nb")]), Err(Refusal::Missing));
    assert_eq!(jwt(&[(at, &[0xff, 0xfe])]), Err(Refusal::Missing));
    let long = vec![b'a'; MAX_CLAIM_LEN + 1];
    assert_eq!(jwt(&[(at, &long)]), Err(Refusal::Missing));
    // Another claim is not this one.
    let sub = "metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload.sub";
    assert_eq!(jwt(&[(sub, b"alice")]), Err(Refusal::Missing));
}

#[test]
fn the_other_sources_are_as_before() {
    let parse = |doc: &str| {
        TenantConfig::compile(crate::config::read::parse(doc.as_bytes()).unwrap()).unwrap()
    };
    let chat = Dialect::Chat;
    let p = "/v1/chat/completions";
    let credential = resolve_with(
        &parse("{}"),
        chat,
        p,
        &[("authorization", "Bearer sk-1")],
        &[],
    )
    .unwrap()
    .tenant
    .unwrap();
    assert_eq!(credential.len(), 12);
    assert!(!credential.contains("sk-1"));
    let header = parse(r#"{"from":"header","header":"x-team"}"#);
    assert_eq!(
        resolve_with(&header, chat, p, &[("x-team", "blue")], &[])
            .unwrap()
            .tenant
            .as_deref(),
        Some("blue")
    );
    assert_eq!(
        resolve_with(&header, chat, p, &[], &[]).unwrap().tenant,
        None
    );
    let peer = parse(r#"{"from":"peer"}"#);
    let san: &[u8] = b"spiffe://cluster.local/ns/a/sa/b";
    let id = resolve_with(
        &peer,
        chat,
        p,
        &[],
        &[("connection.uri_san_peer_certificate", san)],
    );
    assert_eq!(
        id.unwrap().tenant.as_deref(),
        Some("spiffe://cluster.local/ns/a/sa/b")
    );
    assert_eq!(resolve_with(&peer, chat, p, &[], &[]).unwrap().tenant, None);
}

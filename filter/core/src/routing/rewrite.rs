//! The body as one backend takes it: the requested model renamed for a
//! backend that knows it by another name, and the affinity key as
//! `prompt_cache_key` for one that takes it. Only those top-level values
//! change; every other byte is kept, so the rest of the request reaches the
//! backend exactly as the client sent it.

use super::config::Serves;
use crate::dialect::provider::{self, Version};
use crate::dialect::{request, Dialect};
use crate::json::{Document, Json};

/// The body with its top-level `"model"` string replaced by `model`; `None`
/// when the body is not a JSON object, has no top-level `model` string, names
/// it twice (backends disagree on which counts) or is malformed.
pub fn rewrite_model(doc: &Document, model: &str) -> Option<Vec<u8>> {
    let mut copy = doc.bytes_only();
    set_model(&mut copy, model).then(|| copy.into_bytes())
}

/// The body's model, where a body-model dialect keeps it (see
/// [`crate::dialect::request::Request::set_model`]).
fn set_model(doc: &mut Document, model: &str) -> bool {
    request::set_body_model(doc, model)
}

/// Where a backend's name of the model goes: the model to set in the body
/// (`None`: the body stays as it names it), and the `:path` to send the call
/// on for a dialect that names the model there (`None`: `path` as it is).
/// `None` when the dialect's path cannot take `model`: the call must not go
/// to that backend.
pub fn model_edit<'m>(
    dialect: Dialect,
    path: &str,
    model: Option<&'m str>,
) -> Option<(Option<&'m str>, Option<String>)> {
    let api = dialect.request();
    match model {
        Some(m) if api.model_in_path(path).is_some() => {
            api.path_with_model(path, m).map(|p| (None, Some(p)))
        }
        m => Some((m, None)),
    }
}

/// What a backend's body is, next to the one held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// The held body as it is.
    Unchanged,
    /// These bytes.
    Changed(Vec<u8>),
    /// The model cannot be renamed: the call must not go to that backend.
    Refused,
}

/// The body for a backend: `model` its name of the model, when it has its
/// own, and `prompt_cache_key` the key to add, when the backend takes one
/// and the caller named none. A key that cannot be added (the body is no
/// object, or names the member) is left out.
pub fn for_backend(doc: &Document, model: Option<&str>, prompt_cache_key: Option<&str>) -> Edit {
    body_for(
        doc,
        model.map_or(Model::Kept, Model::Set),
        prompt_cache_key,
        None,
    )
}

/// What becomes of the body's `model` for a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model<'m> {
    /// As the client named it.
    Kept,
    /// Renamed.
    Set(&'m str),
    /// Left out: the backend reads it from the path.
    Dropped,
}

/// [`for_backend`], with the model perhaps left out and a top-level string
/// `member` set (an API version the provider reads from the body).
fn body_for(
    doc: &Document,
    model: Model<'_>,
    prompt_cache_key: Option<&str>,
    member: Option<(&str, &str)>,
) -> Edit {
    if model == Model::Kept && prompt_cache_key.is_none() && member.is_none() {
        return Edit::Unchanged;
    }
    let mut copy = doc.bytes_only();
    if let Model::Set(m) = model {
        if !set_model(&mut copy, m) {
            return Edit::Refused;
        }
    }
    if let Some((name, value)) = member {
        let set = serde_json::to_string(value).is_ok_and(|v| copy.set_text(name, v.as_bytes()));
        if !set {
            return Edit::Refused;
        }
    }
    let mut changed = model != Model::Kept || member.is_some();
    if let Some(key) = prompt_cache_key.and_then(|k| serde_json::to_string(k).ok()) {
        // Only where the caller named none: never two members of one name.
        if copy.value_bytes("prompt_cache_key").is_none() {
            changed |= copy.set("prompt_cache_key", key.as_bytes(), Json::Null);
        }
    }
    if model == Model::Dropped {
        return copy.without("model").map_or(Edit::Refused, Edit::Changed);
    }
    if changed {
        Edit::Changed(copy.into_bytes())
    } else {
        Edit::Unchanged
    }
}

/// How one backend takes the call.
#[derive(Debug, PartialEq, Eq)]
pub struct Shaped {
    /// The `:path` to send it on; `None`: the one it has.
    pub path: Option<String>,
    /// Its body.
    pub body: Edit,
    /// A version header to add when the call has none.
    pub header: Option<(&'static str, &'static str)>,
}

/// The call of `dialect` on `path` (a stream when `stream`) as a backend
/// takes it: `serves` how it takes the API (`None`: as the call came),
/// `rename` its name of the model when the body's must change, `name` its
/// name of the model wherever it goes, `prompt_cache_key` the key to add.
/// On its own path, the model goes in the path (then not in the body) when
/// the path has `{model}`; the version goes where the provider reads it.
#[allow(clippy::too_many_arguments)]
pub fn for_serves(
    dialect: Dialect,
    client_path: &str,
    stream: bool,
    serves: Option<&Serves>,
    rename: Option<&str>,
    name: &str,
    doc: &Document,
    prompt_cache_key: Option<&str>,
) -> Shaped {
    let version = serves.and_then(|s| s.version);
    let (header, member) = match version {
        Some(Version::Header(h, v)) => (Some((h, v)), None),
        Some(Version::Body(k, v)) => (None, Some((k, v))),
        None => (None, None),
    };
    let (path, model) = match serves.and_then(|s| s.path(stream)).flatten() {
        Some(t) if t.contains(provider::MODEL) => {
            (Some(provider::path_with(t, name)), Model::Dropped)
        }
        Some(t) => (Some(t.to_string()), rename.map_or(Model::Kept, Model::Set)),
        None => match model_edit(dialect, client_path, rename) {
            Some((model, path)) => (path, model.map_or(Model::Kept, Model::Set)),
            None => {
                return Shaped {
                    path: None,
                    body: Edit::Refused,
                    header,
                }
            }
        },
    };
    Shaped {
        // The path it already has is not written again.
        path: path.filter(|p| p != client_path),
        body: body_for(doc, model, prompt_cache_key, member),
        header,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(body: &str, model: &str) -> Option<String> {
        let doc = Document::parse(body.as_bytes().to_vec());
        rewrite_model(&doc, model).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn replaces_only_the_top_level_model() {
        assert_eq!(
            rw(r#"{"model":"gpt-4o","stream":true}"#, "gpt-4o-2024-08-06").as_deref(),
            Some(r#"{"model":"gpt-4o-2024-08-06","stream":true}"#)
        );
        let body = r#" {
  "messages": [{"role": "user", "content": "say \"model\": \"x\"", "model": "inner"}],
  "metadata" : {"model": "nested", "list": [{"model": 1}, "]", "}"]},
  "n": -1.5e3, "ok": true, "none": null,
  "model" :	"auto" ,
  "tail": {}
}
"#;
        let want = body.replace(r#""model" :	"auto""#, r#""model" :	"llama-3.1-8b""#);
        assert_eq!(rw(body, "llama-3.1-8b").as_deref(), Some(want.as_str()));
    }

    #[test]
    fn handles_escapes_in_keys_values_and_new_name() {
        assert_eq!(
            rw(r#"{"mod\u0065l":"a\"b\\","x":1}"#, "c").as_deref(),
            Some(r#"{"mod\u0065l":"c","x":1}"#)
        );
        assert_eq!(
            rw(r#"{"model":"a"}"#, "we\"ird\\name\n").as_deref(),
            Some(r#"{"model":"we\"ird\\name\n"}"#)
        );
        assert_eq!(
            rw(r#"{"model":"a"}"#, "é").as_deref(),
            Some(r#"{"model":"é"}"#)
        );
        // A key that merely contains an escaped quote is not `model`.
        assert_eq!(rw(r#"{"model\"":"a"}"#, "b"), None);
    }

    #[test]
    fn refuses_what_it_cannot_rewrite_safely() {
        for body in [
            "",
            "   ",
            "[]",
            r#"["model","a"]"#,
            "{}",
            r#"{"messages":[{"model":"a"}]}"#,
            r#"{"model":3}"#,
            r#"{"model":null}"#,
            r#"{"model":{"name":"a"}}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"a"} x"#,
            r#"{"model":"a""#,
            r#"{"model":"a",}"#,
            r#"{"model" "a"}"#,
            r#"{"x":[1,2},"model":"a"}"#,
            r#"{"x":,"model":"a"}"#,
            "{\"model\":\"a\nb\"}",
            r#"{"x":"unterminated}"#,
            r#"{model:"a"}"#,
        ] {
            assert_eq!(rw(body, "z"), None, "{body}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_without_deep_recursion() {
        // The one parse stops at its depth bound: a hostile body never
        // recurses deeper, and (having no tree, so no routing) is never
        // rewritten. Within the bound, nesting is no obstacle.
        let deep = |n: usize| format!(r#"{{"x":{}{},"model":"a"}}"#, "[".repeat(n), "]".repeat(n));
        assert_eq!(rw(&deep(100_000), "b"), None);
        let out = rw(&deep(100), "b").unwrap();
        assert!(out.ends_with(r#","model":"b"}"#));
        assert_eq!(out.len(), deep(100).len());
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz::{self, Doc};
    use crate::json::Json;

    /// A request object with one top-level `model` string among other members.
    fn request() -> impl Strategy<Value = Doc> {
        (fuzz::text(), fuzz::doc(true), 0usize..4).prop_map(|(model, other, at)| {
            let mut members = match other {
                Doc::Obj(m) => m.into_iter().filter(|(k, _)| k != "model").collect(),
                v => vec![("x".to_string(), v)],
            };
            let at = at.min(members.len());
            members.insert(at, ("model".into(), Doc::Str(model)));
            Doc::Obj(members)
        })
    }

    fn with_model(tree: &Json, model: &str) -> Json {
        match tree {
            Json::Object(m) => Json::Object(
                m.iter()
                    .map(|(k, v)| match k.as_str() {
                        "model" => (k.clone(), Json::String(model.into())),
                        _ => (k.clone(), v.clone()),
                    })
                    .collect(),
            ),
            v => v.clone(),
        }
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// The rewritten body means the same request with the new model, and
        /// differs from the original only within the old model's value.
        #[test]
        fn only_the_model_value_changes(req in request(), seed: u64, new in fuzz::text()) {
            let body = req.spell(seed).into_bytes();
            let doc = Document::parse(body.clone());
            let out = rewrite_model(&doc, &new);
            prop_assert!(out.is_some());
            let out = out.unwrap();
            let before = Json::parse(&body).unwrap();
            prop_assert_eq!(Json::parse(&out), Some(with_model(&before, &new)));
            // Every byte outside the old value is kept, and that range held
            // exactly the old model.
            let at = doc.value_range("model").unwrap();
            let old = serde_json::from_slice::<String>(&body[at.clone()]).unwrap();
            prop_assert_eq!(Some(&Json::String(old)), before.get("model"));
            let mut want = body[..at.start].to_vec();
            want.extend_from_slice(serde_json::to_string(&new).unwrap().as_bytes());
            want.extend_from_slice(&body[at.end..]);
            prop_assert_eq!(out, want);
        }

        /// A body that names `model` twice at the top, or is broken, is never
        /// rewritten into something strict JSON reads differently.
        #[test]
        fn broken_or_ambiguous_bodies_are_left_alone(req in request(), seed: u64, dup: bool) {
            let mut req = req;
            if dup {
                if let Doc::Obj(m) = &mut req {
                    m.push(("mod\u{65}l".into(), Doc::Str("other".into())));
                }
                let doc = Document::parse(req.spell(seed).into_bytes());
                prop_assert_eq!(rewrite_model(&doc, "z"), None);
            }
            let broken = fuzz::mutated(&req, seed);
            let doc = Document::parse(broken.clone());
            if let (Some(out), Some(tree)) = (rewrite_model(&doc, "z"), Json::parse(&broken)) {
                prop_assert_eq!(Json::parse(&out), Some(with_model(&tree, "z")));
            }
        }
    }

    #[test]
    fn a_backend_gets_its_model_and_the_cache_key_it_takes() {
        let doc = |s: &str| Document::parse(s.as_bytes().to_vec());
        let text = |e: Edit| match e {
            Edit::Changed(b) => String::from_utf8(b).unwrap(),
            other => format!("{other:?}"),
        };
        let d = doc(r#"{"model":"a","messages":[]}"#);
        assert_eq!(for_backend(&d, None, None), Edit::Unchanged);
        assert_eq!(
            text(for_backend(&d, Some("b"), Some("00ff"))),
            r#"{"model":"b","messages":[],"prompt_cache_key":"00ff"}"#
        );
        assert_eq!(
            text(for_backend(&d, None, Some("00ff"))),
            r#"{"model":"a","messages":[],"prompt_cache_key":"00ff"}"#
        );
        // The caller's own key stays; the held document is left as it was.
        let own = doc(r#"{"model":"a","prompt_cache_key":"mine"}"#);
        assert_eq!(for_backend(&own, None, Some("00ff")), Edit::Unchanged);
        assert_eq!(d.bytes(), br#"{"model":"a","messages":[]}"#);
        // No model to rename: refused, whatever the key.
        assert_eq!(
            for_backend(&doc(r#"{"messages":[]}"#), Some("b"), Some("k")),
            Edit::Refused
        );
        assert_eq!(for_backend(&doc("[]"), None, Some("k")), Edit::Unchanged);
    }

    #[test]
    fn each_provider_gets_the_call_as_it_takes_it() {
        let raw: crate::routing::RawRoutingConfig = serde_json::from_str(
            r#"{"models": {"claude": [
              {"cluster": "anthropic", "provider": "anthropic"},
              {"cluster": "bedrock", "provider": "bedrock", "model": "anthropic.claude-v1:0"},
              {"cluster": "vertex", "provider": "vertex", "apis": ["messages"],
               "paths": {"messages": "/v1/projects/p/locations/l/publishers/anthropic/models/{model}:rawPredict"}},
              {"cluster": "mantle", "provider": "bedrock_mantle"}
            ]}}"#,
        )
        .unwrap();
        let c = crate::routing::RoutingConfig::compile(raw).unwrap();
        let b = c.backends("claude").unwrap();
        let body = r#"{"model":"claude","max_tokens":8,"messages":[]}"#;
        let doc = Document::parse(body.as_bytes().to_vec());
        let shape = |i: usize, stream: bool| {
            let backend = &b[i];
            let serves = backend.serving(Dialect::Messages, stream).unwrap();
            let name = backend.model.as_deref().unwrap_or("claude");
            let s = for_serves(
                Dialect::Messages,
                "/v1/messages?beta=true",
                stream,
                serves,
                backend.model.as_deref(),
                name,
                &doc,
                None,
            );
            let body = match s.body {
                Edit::Changed(b) => String::from_utf8(b).unwrap(),
                e => format!("{e:?}"),
            };
            (s.path, body, s.header)
        };
        let version = Some(("anthropic-version", "2023-06-01"));
        assert_eq!(
            shape(0, true),
            (Some("/v1/messages".into()), "Unchanged".into(), version)
        );
        assert_eq!(
            shape(1, false),
            (
                Some("/model/anthropic.claude-v1%3A0/invoke".into()),
                r#"{"max_tokens":8,"messages":[],"anthropic_version":"bedrock-2023-05-31"}"#.into(),
                None
            )
        );
        assert_eq!(
            shape(2, true),
            (
                Some("/v1/projects/p/locations/l/publishers/anthropic/models/claude:streamRawPredict".into()),
                r#"{"max_tokens":8,"messages":[],"anthropic_version":"vertex-2023-10-16"}"#.into(),
                None
            )
        );
        assert_eq!(
            shape(3, true),
            (
                Some("/anthropic/v1/messages".into()),
                "Unchanged".into(),
                version
            )
        );
        // Nothing declared: as before, the client's path.
        let s = for_serves(
            Dialect::Messages,
            "/v1/messages",
            true,
            None,
            Some("x"),
            "x",
            &doc,
            None,
        );
        assert_eq!((s.path, s.header), (None, None));
        assert_eq!(
            s.body,
            Edit::Changed(br#"{"model":"x","max_tokens":8,"messages":[]}"#.to_vec())
        );
    }

    #[test]
    fn the_model_goes_where_the_dialect_names_it() {
        let chat = "/v1/chat/completions";
        assert_eq!(
            model_edit(Dialect::Chat, chat, Some("b")),
            Some((Some("b"), None))
        );
        assert_eq!(model_edit(Dialect::Chat, chat, None), Some((None, None)));
        let g = "/v1beta/models/a:streamGenerateContent?alt=sse";
        assert_eq!(
            model_edit(Dialect::Gemini, g, Some("b")),
            Some((
                None,
                Some("/v1beta/models/b:streamGenerateContent?alt=sse".into())
            ))
        );
        assert_eq!(model_edit(Dialect::Gemini, g, None), Some((None, None)));
        // A name the path cannot take: not to that backend.
        assert_eq!(model_edit(Dialect::Gemini, g, Some("a/b")), None);
    }
}

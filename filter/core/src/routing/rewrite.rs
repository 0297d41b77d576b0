//! The body as one backend takes it: the requested model renamed for a
//! backend that knows it by another name, and the affinity key as
//! `prompt_cache_key` for one that takes it. Only those top-level values
//! change; every other byte is kept, so the rest of the request reaches the
//! backend exactly as the client sent it.

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
    if model.is_none() && prompt_cache_key.is_none() {
        return Edit::Unchanged;
    }
    let mut copy = doc.bytes_only();
    if let Some(m) = model {
        if !set_model(&mut copy, m) {
            return Edit::Refused;
        }
    }
    let mut changed = model.is_some();
    if let Some(key) = prompt_cache_key.and_then(|k| serde_json::to_string(k).ok()) {
        // Only where the caller named none: never two members of one name.
        if copy.value_bytes("prompt_cache_key").is_none() {
            changed |= copy.set("prompt_cache_key", key.as_bytes(), Json::Null);
        }
    }
    if changed {
        Edit::Changed(copy.into_bytes())
    } else {
        Edit::Unchanged
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

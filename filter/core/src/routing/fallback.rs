//! Fallback chains by error class: a call that its model's backend refuses
//! for a reason another model would not have — the prompt is longer than the
//! model's context, the account's quota is spent, the backend does not serve
//! the model — moves to the next model of its chain (`routing.fallbacks`),
//! within the budget, and the client gets that model's answer with the model
//! named in [`MODEL_HEADER`]. Failover (another backend of the same model)
//! answers 5xx, 429 and resets; this answers the 4xx that no backend of the
//! same model would answer differently.
//!
//! The class is read from the error's body by the call's dialect
//! ([`crate::dialect::answer::Answer::refusal`]); this module says which
//! statuses are worth reading and which refusals move the call on.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::error::ConfigError;
use crate::dialect::answer::{ErrorClass, Refusal};
use crate::dialect::{provider, Dialect};
use crate::host::Metrics;
use crate::metrics as names;

use super::failover::FailoverResult;

/// Response header naming the model that answered after a fallback.
pub const MODEL_HEADER: &str = "x-llm-model";
/// Most models in one chain.
pub const MAX_CHAIN: usize = 4;
/// Most bytes of an error body read to classify it; a longer one is no
/// error body the classes know, and passes to the client untouched.
pub const MAX_ERROR_BODY: usize = 16 * 1024;

/// Whether a response of `status` could be one of the classes: only then is
/// its body held back and read.
pub fn candidate(status: u16) -> bool {
    matches!(status, 400 | 402 | 403 | 404 | 413 | 422 | 429)
}

/// The class of an error answer of `status` to a call of `dialect`, whose
/// body is `body` and whose type a header may name (`error_type`, see
/// [`provider::ERROR_TYPE`]); `None` for any other error (a bad request is
/// the caller's to fix, a rate limit or an overload is failover's) and for
/// a body that is not an error object.
pub fn classify(
    dialect: Dialect,
    status: u16,
    body: &[u8],
    error_type: Option<&str>,
) -> Option<ErrorClass> {
    if !candidate(status) || body.len() > MAX_ERROR_BODY {
        return None;
    }
    let refusal = match error_type.and_then(provider::refusal_named) {
        Some(named) => named,
        None => {
            let doc: Value = serde_json::from_slice(body).ok()?;
            dialect.answer().refusal(status, &doc)?
        }
    };
    match refusal {
        Refusal::ContextLength => Some(ErrorClass::ContextLength),
        Refusal::Quota => Some(ErrorClass::Quota),
        Refusal::UnknownModel => Some(ErrorClass::ModelNotFound),
        Refusal::Overloaded => None,
    }
}

/// A model's compiled chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The classes that move the call on.
    pub on: Vec<ErrorClass>,
    /// The models to try next, in order.
    pub to: Vec<String>,
}

/// The chains of every model that has one.
pub type Chains = BTreeMap<String, Chain>;

/// Compiles `routing.fallbacks` (read as a JSON value rather than derived,
/// which keeps the module smaller): model → `{"on": [classes], "to":
/// [models]}`, `on` all three classes by default. Each chain's model and
/// each model it names must be routed (`routed`), none twice and not the
/// model itself; errors name fields relative to `fallbacks`.
pub fn compile(raw: &Value, routed: &dyn Fn(&str) -> bool) -> Result<Chains, ConfigError> {
    let mut out = Chains::new();
    if raw.is_null() {
        return Ok(out);
    }
    let Some(chains) = raw.as_object() else {
        return Err(ConfigError::new(".", "is not an object of model → chain"));
    };
    for (model, chain) in chains {
        out.insert(model.clone(), compile_chain(model, chain, routed)?);
    }
    Ok(out)
}

/// The chain of `model`: an object of `to` and `on` only.
fn compile_chain(
    model: &str,
    chain: &Value,
    routed: &dyn Fn(&str) -> bool,
) -> Result<Chain, ConfigError> {
    if !routed(model) {
        return Err(ConfigError::new(model, "is not a model of routing.models"));
    }
    let Some(fields) = chain.as_object() else {
        return Err(ConfigError::new(model, "is not an object with `to`"));
    };
    if let Some(unknown) = fields.keys().find(|k| !matches!(k.as_str(), "on" | "to")) {
        return Err(ConfigError::new(
            format!("{model}.{unknown}"),
            "unknown field, expected `on` or `to`",
        ));
    }
    let to = compile_to(model, fields.get("to"), routed)?;
    let on = compile_on(&format!("{model}.on"), fields.get("on"))?;
    Ok(Chain { on, to })
}

/// `to`: 1 to [`MAX_CHAIN`] other routed models, each once.
fn compile_to(
    model: &str,
    to: Option<&Value>,
    routed: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, ConfigError> {
    let field = format!("{model}.to");
    let to = strings(to).ok_or_else(|| ConfigError::new(&field, "is not a list of model names"))?;
    if to.is_empty() || to.len() > MAX_CHAIN {
        return Err(ConfigError::new(
            field,
            format!("names 1 to {MAX_CHAIN} models"),
        ));
    }
    for (i, next) in to.iter().enumerate() {
        if !routed(next) || next == model || to.get(..i).is_some_and(|s| s.contains(next)) {
            return Err(ConfigError::new(
                format!("{field}[{i}]"),
                format!("{next:?} is not another model of routing.models, or is named twice"),
            ));
        }
    }
    Ok(to)
}

/// `on`: error classes, all three by default, sorted and each once.
fn compile_on(field: &str, on: Option<&Value>) -> Result<Vec<ErrorClass>, ConfigError> {
    let Some(v) = on else {
        return Ok(ErrorClass::ALL.to_vec());
    };
    let names = strings(Some(v))
        .ok_or_else(|| ConfigError::new(field, "is not a list of error classes"))?;
    let mut on = Vec::with_capacity(names.len());
    for name in names {
        let class = ErrorClass::ALL.into_iter().find(|c| c.as_str() == name);
        on.push(class.ok_or_else(|| {
            ConfigError::new(
                field,
                format!("{name:?} is not `context_length`, `quota` or `model_not_found`"),
            )
        })?);
    }
    if on.is_empty() {
        return Err(ConfigError::new(field, "names no error class"));
    }
    // Sorted and each once, in `ALL`'s order (the enum's): a filter, not a
    // sort, which would compile a sort for this type into the module.
    Ok(ErrorClass::ALL
        .into_iter()
        .filter(|c| on.contains(c))
        .collect())
}

/// The strings of a JSON list; `None` when it is not one of strings.
fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v?.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

impl Chain {
    /// The model after `step` models of the chain were tried, when `class`
    /// moves the call on.
    pub fn next(&self, class: ErrorClass, step: usize) -> Option<&str> {
        if !self.on.contains(&class) {
            return None;
        }
        self.to.get(step).map(String::as_str)
    }
}

/// Counts a fallback of `model` for `class` by its result.
pub fn count(m: &mut dyn Metrics, model: &str, class: ErrorClass, result: FailoverResult) {
    m.counter(
        &names::name(
            names::ROUTING_MODEL_FALLBACKS,
            &[
                ("model", model),
                ("reason", class.as_str()),
                ("result", result.as_str()),
            ],
        ),
        1,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The class of an error, which every dialect reads alike.
    fn class(status: u16, body: &str) -> Option<ErrorClass> {
        let c = classify(Dialect::Chat, status, body.as_bytes(), None);
        for d in Dialect::names().filter_map(Dialect::named) {
            assert_eq!(
                classify(d, status, body.as_bytes(), None),
                c,
                "{d:?} {body}"
            );
        }
        c
    }

    #[test]
    fn each_dialect_s_errors_are_classified() {
        use ErrorClass::*;
        // OpenAI.
        let openai = |code: &str, message: &str| {
            format!(
                r#"{{"error":{{"message":"{message}","type":"invalid_request_error","param":null,"code":"{code}"}}}}"#
            )
        };
        assert_eq!(
            class(
                400,
                &openai(
                    "context_length_exceeded",
                    "This model's maximum context length is 128000 tokens."
                )
            ),
            Some(ContextLength)
        );
        assert_eq!(
            class(
                429,
                &openai(
                    "insufficient_quota",
                    "You exceeded your current quota, please check your plan."
                )
            ),
            Some(Quota)
        );
        assert_eq!(
            class(
                404,
                &openai(
                    "model_not_found",
                    "The model `gpt-5x` does not exist or you do not have access to it."
                )
            ),
            Some(ModelNotFound)
        );
        // A rate limit is failover's; a plain bad request is the caller's.
        assert_eq!(
            class(
                429,
                &openai("rate_limit_exceeded", "Rate limit reached for requests")
            ),
            None
        );
        assert_eq!(
            class(
                400,
                &openai("invalid_value", "temperature must be at most 2")
            ),
            None
        );
        // Anthropic.
        let anthropic = |kind: &str, message: &str| {
            format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"{message}"}}}}"#)
        };
        assert_eq!(
            class(
                400,
                &anthropic(
                    "invalid_request_error",
                    "prompt is too long: 210000 tokens > 200000 maximum"
                )
            ),
            Some(ContextLength)
        );
        assert_eq!(
            class(
                400,
                &anthropic(
                    "invalid_request_error",
                    "Your credit balance is too low to access the Anthropic API."
                )
            ),
            Some(Quota)
        );
        assert_eq!(
            class(404, &anthropic("not_found_error", "model: claude-9")),
            Some(ModelNotFound)
        );
        // Anthropic's billing refusal (402), and Bedrock's
        // ValidationException for a prompt over the model's context (the
        // type in `x-amzn-errortype`, the body a bare message).
        assert_eq!(
            class(
                402,
                &anthropic("billing_error", "There is an issue with your billing.")
            ),
            Some(Quota)
        );
        assert_eq!(
            class(
                400,
                r#"{"message":"Input is too long for requested model."}"#
            ),
            Some(ContextLength)
        );
        // Bedrock's quota, named only in `x-amzn-errortype`.
        let quota = r#"{"message":"Your request exceeds the service quota for your account."}"#;
        let named = |t| classify(Dialect::Messages, 400, quota.as_bytes(), Some(t));
        assert_eq!(
            named("ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            Some(Quota)
        );
        assert_eq!(named("ValidationException"), None);
        assert_eq!(class(400, quota), None, "unnamed, a bare message");
        // Bedrock's model not ready is failover's, no unknown model.
        assert_eq!(
            class(
                429,
                r#"{"message":"Model is not ready to serve inference requests."}"#
            ),
            None
        );
        assert_eq!(
            class(
                429,
                &anthropic(
                    "rate_limit_error",
                    "Number of requests has exceeded your rate limit"
                )
            ),
            None
        );
        // vLLM's flat error object.
        assert_eq!(
            class(
                404,
                r#"{"object":"error","message":"The model `llama-9` does not exist.","type":"NotFoundError","param":null,"code":404}"#
            ),
            Some(ModelNotFound)
        );
        assert_eq!(
            class(
                400,
                r#"{"object":"error","message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.","type":"BadRequestError","code":400}"#
            ),
            Some(ContextLength)
        );
    }

    #[test]
    fn an_overload_is_failovers_not_a_class() {
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(class(429, overloaded), None);
        let doc: Value = serde_json::from_str(overloaded).unwrap();
        assert_eq!(
            Dialect::Messages.answer().refusal(429, &doc),
            Some(Refusal::Overloaded)
        );
    }

    #[test]
    fn anything_else_is_no_class() {
        for (status, body) in [
            (500, r#"{"error":{"code":"context_length_exceeded"}}"#),
            (200, r#"{"error":{"code":"model_not_found"}}"#),
            (404, "<html>not found</html>"),
            (404, r#"{"error":{"message":"no such route"}}"#),
            (400, ""),
            (400, "[1,2]"),
            (400, r#"{"error":"context length"}"#),
        ] {
            assert_eq!(class(status, body), None, "{status} {body}");
        }
        let long = format!(
            r#"{{"error":{{"code":"insufficient_quota","message":"{}"}}}}"#,
            "x".repeat(MAX_ERROR_BODY)
        );
        assert_eq!(class(429, &long), None, "too long to be read");
    }

    #[test]
    fn chains_are_checked_against_the_routed_models() {
        let routed = |m: &str| ["a", "b", "c"].contains(&m);
        let raw = |json: &str| -> Value { serde_json::from_str(json).unwrap() };
        let chains = compile(&raw(r#"{"a": {"to": ["b", "c"]}}"#), &routed).unwrap();
        let a = &chains["a"];
        assert_eq!(a.on, ErrorClass::ALL.to_vec());
        assert_eq!(a.next(ErrorClass::Quota, 0), Some("b"));
        assert_eq!(a.next(ErrorClass::Quota, 1), Some("c"));
        assert_eq!(a.next(ErrorClass::Quota, 2), None);
        let only = compile(
            &raw(r#"{"a": {"on": ["context_length"], "to": ["b"]}}"#),
            &routed,
        )
        .unwrap();
        let repeated = compile(
            &raw(r#"{"a": {"on": ["model_not_found", "context_length", "model_not_found"], "to": ["b"]}}"#),
            &routed,
        )
        .unwrap();
        assert_eq!(
            repeated["a"].on,
            [ErrorClass::ContextLength, ErrorClass::ModelNotFound],
            "sorted and each once"
        );
        assert_eq!(only["a"].next(ErrorClass::Quota, 0), None);
        assert_eq!(only["a"].next(ErrorClass::ContextLength, 0), Some("b"));
        for (json, at) in [
            (r#"{"x": {"to": ["b"]}}"#, "x"),
            (r#"{"a": {"to": []}}"#, "a.to"),
            (r#"{"a": {"to": ["a"]}}"#, "a.to[0]"),
            (r#"{"a": {"to": ["b", "b"]}}"#, "a.to[1]"),
            (r#"{"a": {"to": ["z"]}}"#, "a.to[0]"),
            (r#"{"a": {"to": ["b"], "on": []}}"#, "a.on"),
            (r#"{"a": {"to": ["b", "c", "b", "c", "b"]}}"#, "a.to"),
            (r#"{"a": {"to": ["b"], "on": ["moon"]}}"#, "a.on"),
            (r#"{"a": {"to": ["b"], "when": []}}"#, "a.when"),
            (r#"{"a": {"to": "b"}}"#, "a.to"),
            (r#"{"a": ["b"]}"#, "a"),
            (r#"["a"]"#, "."),
        ] {
            let e = compile(&raw(json), &routed).unwrap_err();
            assert_eq!(e.field, at, "{json}: {e:?}");
        }
        assert!(compile(&Value::Null, &routed).unwrap().is_empty());
    }
}

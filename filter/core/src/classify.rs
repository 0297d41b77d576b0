//! Which requests are LLM calls. Everything else passes untouched, so this is
//! decided from the method and path alone, before any body is read.

use serde::Deserialize;

/// The OpenAI-compatible operation a call performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `…/chat/completions`
    Chat,
    /// `…/completions`
    Completions,
    /// `…/embeddings`
    Embeddings,
    /// A configured path of another shape.
    Other,
}

impl Endpoint {
    /// The OpenTelemetry GenAI operation name.
    pub fn operation(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "text_completion",
            Self::Embeddings => "embeddings",
            Self::Other => "other",
        }
    }
}

/// The default LLM paths: the three OpenAI-compatible POST endpoints.
pub const DEFAULT_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// The endpoint of an LLM call, or `None` for any other request. Only `POST`
/// to one of `paths` (query string ignored) is an LLM call.
pub fn classify<S: AsRef<str>>(method: &str, path: &str, paths: &[S]) -> Option<Endpoint> {
    if method != "POST" {
        return None;
    }
    let path = path.split(['?', '#']).next().unwrap_or(path);
    if !paths.iter().any(|p| p.as_ref() == path) {
        return None;
    }
    Some(if path.ends_with("/chat/completions") {
        Endpoint::Chat
    } else if path.ends_with("/completions") {
        Endpoint::Completions
    } else if path.ends_with("/embeddings") {
        Endpoint::Embeddings
    } else {
        Endpoint::Other
    })
}

/// The `model` of a request body, when the body is a JSON object that names one.
pub fn model(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Body {
        model: Option<String>,
    }
    serde_json::from_slice::<Body>(body).ok()?.model
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_llm_calls_by_method_and_path() {
        let p = DEFAULT_PATHS;
        assert_eq!(
            classify("POST", "/v1/chat/completions", &p),
            Some(Endpoint::Chat)
        );
        assert_eq!(
            classify("POST", "/v1/completions?x=1", &p),
            Some(Endpoint::Completions)
        );
        assert_eq!(
            classify("POST", "/v1/embeddings", &p),
            Some(Endpoint::Embeddings)
        );
        assert_eq!(classify("GET", "/v1/chat/completions", &p), None);
        assert_eq!(classify("POST", "/v1/models", &p), None);
        assert_eq!(classify("POST", "/v1/chat/completions/x", &p), None);
        assert_eq!(classify("POST", "/V1/chat/completions", &p), None);
        let custom = ["/openai/deployments/gpt/chat/completions", "/generate"];
        assert_eq!(
            classify("POST", "/openai/deployments/gpt/chat/completions", &custom),
            Some(Endpoint::Chat)
        );
        assert_eq!(
            classify("POST", "/generate", &custom),
            Some(Endpoint::Other)
        );
        assert_eq!(classify("POST", "/v1/chat/completions", &custom), None);
    }

    #[test]
    fn reads_the_model() {
        assert_eq!(
            model(br#"{"model":"gpt-4o","x":[1]}"#).as_deref(),
            Some("gpt-4o")
        );
        assert_eq!(model(br#"{"messages":[]}"#), None);
        assert_eq!(model(b"not json"), None);
        assert_eq!(model(br#"{"model":3}"#), None);
        assert_eq!(model(b""), None);
    }
}

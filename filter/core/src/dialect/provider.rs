//! The providers a backend can be: for each, the APIs it serves and how it
//! takes each one (the path, the model in the body or in the path, the API
//! version it wants). A table, not code: routing reads a backend's entry to
//! know whether it speaks a call's shape and where the call goes there.
//! Nothing is translated; a preset only says where a shape is spoken.

use super::answer::Refusal;
use super::Dialect;

/// How a stream of an endpoint is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// On the same path (`"stream": true` in the body).
    Same,
    /// On the path with its verb `.0` made `.1` (Vertex's `:rawPredict` and
    /// `:streamRawPredict`).
    Verb(&'static str, &'static str),
    /// Not in the call's shape: a stream never goes there (Bedrock's
    /// `invoke-with-response-stream` frames events as AWS event stream, not
    /// server-sent events).
    Never,
}

/// The API version a provider wants, and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// A request header, added when the call has none.
    Header(&'static str, &'static str),
    /// A top-level body string, set (the body then names no `model`: it is
    /// in the path).
    Body(&'static str, &'static str),
}

/// One API of a preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The API.
    pub api: Dialect,
    /// The path; `{model}` where the model goes in it (then not in the
    /// body). `{project}` and `{location}` are the operator's to write.
    pub path: &'static str,
    /// How a stream is asked for.
    pub streams: Streams,
    /// The version it wants.
    pub version: Option<Version>,
}

/// A provider: its name in config and in `x-llm-provider`, and its APIs.
#[derive(Debug)]
pub struct Preset {
    /// The name.
    pub name: &'static str,
    /// The APIs it serves.
    pub endpoints: &'static [Endpoint],
}

impl Preset {
    /// How it serves `api`, when it does.
    pub fn endpoint(&self, api: Dialect) -> Option<&'static Endpoint> {
        self.endpoints.iter().find(|e| e.api == api)
    }
}

const fn at(api: Dialect, path: &'static str) -> Endpoint {
    Endpoint {
        api,
        path,
        streams: Streams::Same,
        version: None,
    }
}

const ANTHROPIC_VERSION: Option<Version> = Some(Version::Header("anthropic-version", "2023-06-01"));

/// Every preset.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "openai",
        endpoints: &[
            at(Dialect::Chat, "/v1/chat/completions"),
            at(Dialect::Completions, "/v1/completions"),
            at(Dialect::Embeddings, "/v1/embeddings"),
            at(Dialect::Responses, "/v1/responses"),
        ],
    },
    // Azure OpenAI's v1 API: the deployment is the body's `model`, no
    // dated `api-version` (a dated deployment path goes under `paths`).
    Preset {
        name: "azure_openai",
        endpoints: &[
            at(Dialect::Chat, "/openai/v1/chat/completions"),
            at(Dialect::Completions, "/openai/v1/completions"),
            at(Dialect::Embeddings, "/openai/v1/embeddings"),
            at(Dialect::Responses, "/openai/v1/responses"),
        ],
    },
    Preset {
        name: "anthropic",
        endpoints: &[Endpoint {
            version: ANTHROPIC_VERSION,
            ..at(Dialect::Messages, "/v1/messages")
        }],
    },
    // bedrock-runtime: Claude over InvokeModel (the model in the path, the
    // version in the body), and the OpenAI-compatible chat.
    Preset {
        name: "bedrock",
        endpoints: &[
            Endpoint {
                api: Dialect::Messages,
                path: "/model/{model}/invoke",
                streams: Streams::Never,
                version: Some(Version::Body("anthropic_version", "bedrock-2023-05-31")),
            },
            at(Dialect::Chat, "/openai/v1/chat/completions"),
        ],
    },
    // bedrock-mantle: Anthropic's Messages and OpenAI's chat and Responses
    // as those providers take them.
    Preset {
        name: "bedrock_mantle",
        endpoints: &[
            Endpoint {
                version: ANTHROPIC_VERSION,
                ..at(Dialect::Messages, "/anthropic/v1/messages")
            },
            at(Dialect::Chat, "/v1/chat/completions"),
            at(Dialect::Responses, "/v1/responses"),
        ],
    },
    // Vertex AI: Claude over rawPredict, Gemini, and the OpenAI-compatible
    // chat; every path names the operator's project and location.
    Preset {
        name: "vertex",
        endpoints: &[
            Endpoint {
                api: Dialect::Messages,
                path: "/v1/projects/{project}/locations/{location}/publishers/anthropic/models/{model}:rawPredict",
                streams: Streams::Verb(":rawPredict", ":streamRawPredict"),
                version: Some(Version::Body("anthropic_version", "vertex-2023-10-16")),
            },
            Endpoint {
                api: Dialect::Gemini,
                path: "/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent",
                streams: Streams::Verb(":generateContent", ":streamGenerateContent?alt=sse"),
                version: None,
            },
            at(
                Dialect::Chat,
                "/v1/projects/{project}/locations/{location}/endpoints/openapi/chat/completions",
            ),
        ],
    },
    Preset {
        name: "gemini",
        endpoints: &[
            Endpoint {
                api: Dialect::Gemini,
                path: "/v1beta/models/{model}:generateContent",
                streams: Streams::Verb(":generateContent", ":streamGenerateContent?alt=sse"),
                version: None,
            },
            at(Dialect::Chat, "/v1beta/openai/chat/completions"),
            at(Dialect::Embeddings, "/v1beta/openai/embeddings"),
        ],
    },
    Preset {
        name: "vllm",
        endpoints: &[
            at(Dialect::Chat, "/v1/chat/completions"),
            at(Dialect::Completions, "/v1/completions"),
            at(Dialect::Embeddings, "/v1/embeddings"),
            at(Dialect::Responses, "/v1/responses"),
            at(Dialect::Messages, "/v1/messages"),
        ],
    },
];

/// The preset named `name`.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The response header AWS names an error's type in (`Type:namespace`);
/// Bedrock's error bodies are a bare message.
pub const ERROR_TYPE: &str = "x-amzn-errortype";

/// The refusal an error of `error_type` (as [`ERROR_TYPE`] names it) is,
/// when its body cannot say: Bedrock's `ServiceQuotaExceededException`,
/// a 400 for the account's quota spent.
pub fn refusal_named(error_type: &str) -> Option<Refusal> {
    error_type
        .starts_with("ServiceQuotaExceededException")
        .then_some(Refusal::Quota)
}

/// What a `provider` that names no preset is told.
pub const UNKNOWN: &str =
    "is not one of openai, azure_openai, anthropic, bedrock, bedrock_mantle, vertex, gemini, vllm";

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The placeholder of the model in a path.
pub const MODEL: &str = "{model}";

/// `template` with the model `name` in place of `{model}`, the name
/// percent-encoded where a path segment could not hold it as it is
/// (Bedrock's `…-v1:0` and ARNs; Vertex's `@` stays).
pub fn path_with(template: &str, name: &str) -> String {
    let mut encoded = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'@') {
            encoded.push(char::from(b));
        } else {
            encoded.push('%');
            for nibble in [b >> 4, b & 15] {
                if let Some(h) = HEX.get(usize::from(nibble)) {
                    encoded.push(char::from(*h));
                }
            }
        }
    }
    template.replacen(MODEL, &encoded, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_has_one_name_and_each_api_once() {
        let listed: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        assert!(UNKNOWN.ends_with(&listed.join(", ")));
        for (i, p) in PRESETS.iter().enumerate() {
            assert_eq!(preset(p.name).map(|q| q.name), Some(p.name));
            assert!(PRESETS[..i].iter().all(|q| q.name != p.name));
            for (j, e) in p.endpoints.iter().enumerate() {
                assert!(
                    p.endpoints[..j].iter().all(|f| f.api != e.api),
                    "{}",
                    p.name
                );
                assert!(e.path.starts_with('/'), "{}", e.path);
                if let Streams::Verb(from, _) = e.streams {
                    assert!(e.path.ends_with(from), "{}", e.path);
                }
                // The model is in the path exactly when the body says nothing of it.
                let in_path = e.path.contains(MODEL);
                let body_version = matches!(e.version, Some(Version::Body(..)));
                assert!(!body_version || in_path, "{}", e.path);
            }
        }
        assert!(preset("aws").is_none());
    }

    #[test]
    fn the_model_goes_in_the_path_encoded() {
        let t = preset("bedrock")
            .and_then(|p| p.endpoint(Dialect::Messages))
            .unwrap()
            .path;
        assert_eq!(
            path_with(t, "anthropic.claude-sonnet-4-5-20250929-v1:0"),
            "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
        );
        assert_eq!(path_with("/m/{model}:x", "a/b?c"), "/m/a%2Fb%3Fc:x");
        assert_eq!(
            path_with("/m/{model}:rawPredict", "claude-sonnet-4@20250514"),
            "/m/claude-sonnet-4@20250514:rawPredict"
        );
    }
}

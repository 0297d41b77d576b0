//! Token usage as the provider reports it in a JSON answer, and the request
//! edit that asks a stream for it (`stream_options.include_usage`: the final
//! chunk then carries `usage`, which the stream reading in `sse` picks up).

use serde::Deserialize;

use crate::json::{Document, Json};

/// Tokens of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// Input tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Output tokens (absent for embeddings).
    #[serde(default)]
    pub completion_tokens: u64,
}

#[derive(Deserialize)]
struct WithUsage {
    usage: Option<Usage>,
}

/// The `usage` of a JSON answer body.
pub fn from_json(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<WithUsage>(body).ok()?.usage
}

/// The `usage` of a JSON answer already parsed.
pub fn from_value(answer: &serde_json::Value) -> Option<Usage> {
    WithUsage::deserialize(answer).ok()?.usage
}

/// The value of `stream_options` that asks the provider for usage.
const ASK_USAGE: &[u8] = br#"{"include_usage":true}"#;

/// Sets `stream_options.include_usage` in the body of a streamed request,
/// every other byte kept. False, and nothing changed, when it needs no change
/// (not a stream, or usage already asked) or cannot take one without
/// rewriting what the client wrote (a `stream_options` of its own).
pub fn ask_for_usage(doc: &mut Document) -> bool {
    let Some(tree) = doc.tree() else {
        return false;
    };
    if tree.get("stream") != Some(&Json::Bool(true)) || tree.get("stream_options").is_some() {
        return false;
    }
    doc.set_text("stream_options", ASK_USAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_asked_of_streams_that_did_not() {
        for (body, want) in [
            (
                r#" {"stream":true,"model":"m"}"#,
                Some(r#" {"stream":true,"model":"m","stream_options":{"include_usage":true}}"#),
            ),
            (r#"{"stream":false}"#, None),
            (r#"{"model":"m"}"#, None),
            (r#"{"stream":true,"stream_options":null}"#, None),
            (
                r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
                None,
            ),
            (
                r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
                None,
            ),
        ] {
            let mut doc = Document::parse(body.as_bytes().to_vec());
            let got = ask_for_usage(&mut doc).then(|| doc.into_bytes());
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{body}");
            if let Some(got) = got {
                let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
                assert_eq!(v["stream_options"]["include_usage"], true);
            }
        }
    }

    #[test]
    fn reads_json_usage() {
        let body =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;
        assert_eq!(
            from_json(body),
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 5
            })
        );
        assert_eq!(
            from_json(br#"{"usage":{"prompt_tokens":3,"total_tokens":3}}"#),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 0
            })
        );
        assert_eq!(from_json(br#"{"usage":null}"#), None);
        assert_eq!(from_json(b"{"), None);
    }

    #[test]
    fn a_parsed_answer_gives_the_same_usage() {
        for body in [
            r#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":5}}"#,
            r#"{"usage":{"prompt_tokens":3}}"#,
            r#"{"usage":null}"#,
            r#"{"usage":{"prompt_tokens":"3"}}"#,
            r#"{"choices":[]}"#,
            r#"[1]"#,
        ] {
            let tree: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(from_value(&tree), from_json(body.as_bytes()), "{body}");
        }
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    proptest! {
        #![proptest_config(fuzz::config(128))]

        /// A JSON body's usage reads the same from the bytes and from the
        /// parsed tree.
        #[test]
        fn any_body_reads_alike(doc in fuzz::doc(false), seed: u64) {
            let body = fuzz::mutated(&doc, seed);
            if let Ok(tree) = serde_json::from_slice::<serde_json::Value>(&body) {
                prop_assert_eq!(from_value(&tree), from_json(&body));
            }
        }
    }
}

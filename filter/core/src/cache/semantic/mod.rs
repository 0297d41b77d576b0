//! The semantic cache: a reworded repeat of a cached question is answered
//! from the exact cache's entry of the original. Two calls can match only
//! when everything but the wording of the last user message is identical
//! (model, earlier messages, tools, sampling, path, tenant): that is the
//! call's *context key*, and only vectors of the same context are compared.
//! The question's vector comes from an embeddings service by callout; when it
//! fails or is late the call is a plain miss.
//!
//! The walk: [`query`] on a cacheable call the exact cache missed, a callout
//! built by [`embeddings_request`], its answer read by [`read_embedding`],
//! then [`store::Index::lookup`]; a fresh answer stored by the exact cache is
//! added with [`store::Index::insert`].

pub mod config;
pub mod store;
pub mod vector;

use serde::Deserialize;

use super::config::CacheConfig;
use super::key::{self, CacheRequest, Key};
use crate::config::service::Callout;
use crate::dialect::request::Question;
use crate::json::Json;
use config::{EmbeddingsConfig, SemanticConfig};

pub use config::RawSemanticConfig;
pub use store::{Index, Matches};

/// Response header with the similarity of a semantic hit, `0.000`–`1.000`.
pub const X_CACHE_SIMILARITY: &str = "x-cache-similarity";

/// Bumped with the context's canonical form; distinct from the exact key's.
const CONTEXT_VERSION: &[u8] = b"llm-filter/semantic-context/v1";

/// What a call asks the semantic cache with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Hash of everything but the wording of the last user message.
    pub context: Key,
    /// That wording: the text embedded.
    pub text: String,
}

/// The semantic query of a call the exact cache found cacheable, `None` when
/// it does not take part: not chat or completions, no last user message of
/// text only (a completions `prompt` that is one string), an empty or too
/// long question.
pub fn query(
    cfg: &CacheConfig,
    sem: &SemanticConfig,
    req: &CacheRequest<'_>,
    body: &Json,
) -> Option<Query> {
    let question = req.dialect.request().question()?;
    let mut context = body.clone();
    let text = match question {
        Question::LastUserMessage => take_last_user_text(&mut context)?,
        Question::LastUserParts => take_last_user_parts(&mut context)?,
        Question::Member(name) => take_member_text(&mut context, name)?,
    };
    if text.trim().is_empty() || text.len() > sem.max_text_bytes as usize {
        return None;
    }
    Some(Query {
        context: key::digest(CONTEXT_VERSION, cfg, req, &context),
        text,
    })
}

/// Takes the text of the last `user` message out of `messages` (its content
/// becomes `null`), `None` when there is none or it has a part other than text.
fn take_last_user_text(body: &mut Json) -> Option<String> {
    let Json::Object(members) = body else {
        return None;
    };
    let (_, Json::Array(messages)) = members.iter_mut().find(|(k, _)| k == "messages")? else {
        return None;
    };
    let message = messages
        .iter_mut()
        .rev()
        .find(|m| matches!(m.get("role"), Some(Json::String(r)) if r == "user"))?;
    let text = text_of(message.get("content")?)?;
    take_member_text(message, "content").map(|_| text)
}

/// Takes the text of the last `user` content of Gemini's `contents` (its
/// `parts` become `null`), `None` when there is none or a part of it is
/// anything but a text.
fn take_last_user_parts(body: &mut Json) -> Option<String> {
    let Json::Object(members) = body else {
        return None;
    };
    let (_, Json::Array(contents)) = members.iter_mut().find(|(k, _)| k == "contents")? else {
        return None;
    };
    let content = contents.iter_mut().rev().find(|c| match c.get("role") {
        None => true,
        Some(Json::String(r)) => r == "user",
        Some(_) => false,
    })?;
    let Json::Object(fields) = content else {
        return None;
    };
    let (_, parts) = fields.iter_mut().find(|(k, _)| k == "parts")?;
    let Json::Array(list) = &*parts else {
        return None;
    };
    let mut out = String::new();
    for part in list {
        let Json::Object(m) = part else {
            return None;
        };
        let [(name, Json::String(text))] = m.as_slice() else {
            return None;
        };
        if name != "text" {
            return None;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(text);
    }
    *parts = Json::Null;
    Some(out)
}

/// Replaces member `name` of an object with `null`, returning its text.
fn take_member_text(obj: &mut Json, name: &str) -> Option<String> {
    let Json::Object(members) = obj else {
        return None;
    };
    let (_, value) = members.iter_mut().find(|(k, _)| k == name)?;
    let text = text_of(value)?;
    *value = Json::Null;
    Some(text)
}

/// A string, or an array of parts that are all `{"type":"text","text":…}`
/// (joined by newlines); anything else (an image, audio, a file) is `None`.
fn text_of(content: &Json) -> Option<String> {
    match content {
        Json::String(s) => Some(s.clone()),
        Json::Array(parts) if !parts.is_empty() => {
            let mut out = String::new();
            for part in parts {
                let (Some(Json::String(t)), Some(Json::String(text))) =
                    (part.get("type"), part.get("text"))
                else {
                    return None;
                };
                let Json::Object(members) = part else {
                    return None;
                };
                if t != "text" || members.len() != 2 {
                    return None;
                }
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(text);
            }
            Some(out)
        }
        _ => None,
    }
}

/// The headers and body of the embeddings callout for `text`.
pub fn embeddings_request(cfg: &EmbeddingsConfig, text: &str) -> Callout {
    let body = serde_json::json!({ "model": cfg.model, "input": text }).to_string();
    let service = &cfg.service;
    let headers = service.request_headers(
        "POST",
        &service.path,
        Some(("application/json", body.len())),
    );
    (headers, body.into_bytes())
}

/// Why a callout brought no usable vector (the `reason` of the failures
/// counter); the call then goes on as a plain miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedFailure {
    /// The host refused to send the callout (e.g. an unknown cluster).
    Dispatch,
    /// No answer in `timeout_ms` (Envoy's 504), or the connection failed.
    Timeout,
    /// An answer other than 200.
    Status,
    /// A body without one finite, non-zero vector.
    Invalid,
    /// A vector longer than `max_dimensions`.
    Dimensions,
}

impl EmbedFailure {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dispatch => "dispatch",
            Self::Timeout => "timeout",
            Self::Status => "status",
            Self::Invalid => "invalid",
            Self::Dimensions => "dimensions",
        }
    }
}

#[derive(Deserialize)]
struct EmbeddingsAnswer {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    embedding: Vec<f32>,
}

/// The unit vector of an embeddings answer (`status` `None`: none came).
pub fn read_embedding(
    status: Option<u16>,
    body: &[u8],
    max_dimensions: u32,
) -> Result<Vec<f32>, EmbedFailure> {
    match status {
        // Envoy answers a callout past its timeout with its own 504.
        None | Some(504) => return Err(EmbedFailure::Timeout),
        Some(200) => {}
        Some(_) => return Err(EmbedFailure::Status),
    }
    let answer: EmbeddingsAnswer =
        serde_json::from_slice(body).map_err(|_| EmbedFailure::Invalid)?;
    let [item] = answer.data.as_slice() else {
        return Err(EmbedFailure::Invalid);
    };
    if item.embedding.len() > max_dimensions as usize {
        return Err(EmbedFailure::Dimensions);
    }
    vector::normalise(&item.embedding).ok_or(EmbedFailure::Invalid)
}

#[cfg(all(test, feature = "cache"))]
mod tests;

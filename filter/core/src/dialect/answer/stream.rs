//! The event grammars of the dialects' streams, each read as it passes by
//! the generic reader of [`crate::sse`]: OpenAI's chat and text completions
//! (`data:` chunks ending with `data: [DONE]`), OpenAI Responses and
//! Anthropic Messages (named events, the usage in the final or split over
//! several), Google Gemini (whole responses, no terminator). A dialect gives its own ([`super::Answer::grammar`]).

pub mod chat;
pub mod gemini;
pub mod messages;
pub mod responses;

pub use chat::Chat;
pub use gemini::Gemini;
pub use messages::Messages;
pub use responses::Responses;

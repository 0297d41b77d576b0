//! The semantic cache's steps in a build without the response cache: no
//! call ever waits for an embedding.

use super::{Call, CalloutAnswer, Env, Host, Step};

impl Call {
    /// Never asked for: no call waits for an embedding.
    pub(super) fn embedding_answered(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _answer: &CalloutAnswer,
    ) -> Step {
        Step::Pause
    }
}

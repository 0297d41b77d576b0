//! What a call says, read once by its dialect: the request view every
//! concern reads, the prompt's texts, and the edits a step makes.

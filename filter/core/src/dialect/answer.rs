//! What an answer says, read by its dialect: usage, the stream's grammar,
//! the stored entry, the local-reply and error shapes and the error classes.

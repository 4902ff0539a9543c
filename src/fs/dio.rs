//! (filled in)

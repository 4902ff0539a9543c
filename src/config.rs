//! Configuration (filled in)

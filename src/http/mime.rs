//! (filled in by the http work)

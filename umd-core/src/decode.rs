//! Command-stream decoder (being written).

//! Logical commands and command buffers (being written).

//! GPU memory management (issue 3): not written yet.

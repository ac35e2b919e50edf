//! Placeholder: filled by the operator work.

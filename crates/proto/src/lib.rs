//! fatpipe-proto: see ARCHITECTURE.md. This crate is being built; its owner replaces this line.

//! fatpipe-lab (being built)
pub mod model;

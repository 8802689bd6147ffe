//! fatpipe-lab (being built)
pub mod model;
pub mod packet;
pub mod pipe;
pub mod ring;

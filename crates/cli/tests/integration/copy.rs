//! Integration tests for this subcommand; its owner fills this module.

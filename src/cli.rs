//! Command-line interface definitions.

/// `print!` that returns the stdout error instead of panicking.
macro_rules! out {
    ($($t:tt)*) => {
        bmoe::stdio::out(&format!($($t)*))?
    };
}

/// `println!` that returns the stdout error instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {
        bmoe::stdio::out(&(format!($($t)*) + "\n"))?
    };
}

pub mod args;
pub mod chat;
pub mod checks;
pub mod commands;
pub mod fixture;
#[cfg(test)]
mod flag_tree;
pub mod generation;
pub mod graph;
pub mod inspect;
pub mod model;
pub mod prompt_cache;
pub mod replay;
pub mod rpc;
pub mod run;
pub mod sampling;
pub mod serve;
pub mod spec;
pub mod stream;
pub mod tokens;
pub mod trace;
pub mod usage;

pub use args::{parse, Cli, Command};

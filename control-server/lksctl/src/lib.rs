//! `lksctl`, the operator CLI for the lksadmin control server, as a
//! library: one module per verb over the admin API client (`client`) and
//! the output (`output`), and the browser console over the verbs. The
//! binary (`main.rs`) only parses the command line, checks it before any
//! call and dispatches to these modules; no module reaches back into it.
//!
//! Every error is one line on stderr (`error: …`) and a non-zero exit.

#![forbid(unsafe_code)]

/// `print!` for lksctl's output: a reader that stops reading (`lksctl node
/// list | head -1`, `| grep -q`) ends lksctl quietly with status 0 instead
/// of a panic.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write_stdout(format_args!($($arg)*)) };
}

/// `println!` for lksctl's output; see [`out!`].
#[macro_export]
macro_rules! outln {
    () => { $crate::output::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

pub mod audit;
pub mod bundle;
pub mod client;
pub mod cloudinit;
pub mod cluster;
pub mod console;
pub mod event;
pub mod flags;
pub mod mirror;
pub mod node;
pub mod output;
pub mod plan;
pub mod reboot;
pub mod release;
pub mod rollout;
pub mod token;

//! Size and count limits enforced on bundles by every layer.
//!
//! They exist so that a malformed or hostile manifest cannot exhaust memory or
//! disk on the server or a node before any byte is verified.

use std::time::Duration;

/// Longest target path, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;
/// Longest path component, in bytes (Linux `NAME_MAX`).
pub const MAX_COMPONENT_LEN: usize = 255;
/// Longest bundle name.
pub const MAX_NAME_LEN: usize = 63;
/// Longest bundle version string.
pub const MAX_VERSION_LEN: usize = 128;
/// Most files in one bundle.
pub const MAX_FILES: usize = 4096;
/// Largest single file (a kubelet binary is ~100 MiB).
pub const MAX_FILE_SIZE: u64 = 2 << 30;
/// Largest bundle, all files together.
pub const MAX_BUNDLE_SIZE: u64 = 4 << 30;
/// Most steps in one bundle.
pub const MAX_STEPS: usize = 64;
/// Most arguments in one command.
pub const MAX_ARGS: usize = 256;
/// Longest single argument, in bytes.
pub const MAX_ARG_LEN: usize = 4096;
/// Longest step name.
pub const MAX_STEP_NAME_LEN: usize = 128;
/// Longest mirror URL.
pub const MAX_URL_LEN: usize = 2048;
/// Longest step or health check timeout.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Step timeout when the bundle gives none.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(300);
/// Health check timeout per attempt when the bundle gives none.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Health check attempts when the bundle gives none.
pub const DEFAULT_HEALTH_RETRIES: u32 = 3;
/// Pause between health check attempts when the bundle gives none.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(2);
/// Most health check attempts.
pub const MAX_HEALTH_RETRIES: u32 = 100;
/// Size of a `bundle.toml` we are willing to parse.
pub const MAX_BUNDLE_TOML_SIZE: u64 = 1 << 20;
/// Most labels on a node, token or selector.
pub const MAX_LABELS: usize = 64;
/// Most keys in a trust root ([`crate::release::TrustRoot`]).
pub const MAX_ROOT_KEYS: usize = 16;
/// Most signatures on one signed release or trust root; a record with more
/// is refused before any signature is checked.
pub const MAX_SIGNATURES: usize = 32;
/// Most bundles one release names.
pub const MAX_RELEASE_BUNDLES: usize = 256;
/// Largest signed release a decoder should read, in bytes: a release at
/// every limit above, with its signatures and wire framing, fits with room
/// to spare (a test in `release` proves it), so anything longer is refused
/// before it is parsed or verified.
pub const MAX_RELEASE_BYTES: usize = 128 << 10;
/// Largest signed trust root a decoder should read, in bytes (as
/// [`MAX_RELEASE_BYTES`]).
pub const MAX_ROOT_BYTES: usize = 8 << 10;

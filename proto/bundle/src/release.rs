//! Signed release records and the trust root that signs them: what stops a
//! compromised or stale control server from rolling a node back, freezing
//! it on old bundles, or mixing bundles that were never released together.
//!
//! A signed bundle ([`crate::sign`]) proves *who* made a manifest, not that
//! it is still *current*. A [`Release`] says which bundle versions are
//! released together on one channel (a tenant cluster's name), with a
//! version and an expiry; a threshold of the keys of the node's
//! [`TrustRoot`] signs it. Everything here is pure: time comes in as
//! `now_ms` (milliseconds since the Unix epoch) and the caller keeps the
//! [`TrustState`] durable.
//!
//! # Rules
//!
//! Records
//! - A release names its channel (a cluster name, [`crate::names`]), a
//!   version (≥ 1), an expiry and at most [`MAX_RELEASE_BUNDLES`] bundles,
//!   each a valid bundle name with a valid version and the digest of its
//!   canonical manifest ([`crate::canonical::manifest_digest`]).
//! - A trust root has a version (≥ 1), 1 to [`MAX_ROOT_KEYS`] distinct keys
//!   (a key listed twice is refused; [`TrustRoot::initial`] drops repeats),
//!   a threshold between 1 and the number of keys, and an expiry where
//!   [`TrustRoot::NEVER_EXPIRES`] (0) means none: the initial root comes
//!   from the node's own configuration, and an offline root key need not be
//!   re-signed on a schedule. Any other value is a deadline.
//! - Each record is signed over its canonical encoding: a domain separator
//!   of its own ([`RELEASE_DOMAIN`], [`ROOT_DOMAIN`], so no signature over
//!   one kind of record, or over a manifest, verifies as another), then
//!   fixed-width big-endian integers and length-prefixed strings, bundles in
//!   name order and root keys in byte order (neither order carries meaning).
//!
//! Signatures and thresholds
//! - A signed record carrying more than [`MAX_SIGNATURES`] signatures is
//!   refused before any is checked; every other limit above is checked
//!   before any signature too, and a decoder refuses more than
//!   [`MAX_RELEASE_BYTES`] / [`MAX_ROOT_BYTES`] before it parses.
//! - A signature counts once per distinct key. Signatures by keys the root
//!   does not list are ignored (a publisher may sign for several roots); a
//!   signature by a listed key that does not verify does not count and is
//!   named in the error when the threshold is not met.
//!
//! Accepting a release ([`TrustState::accept_release`]), in this order
//! - The clock must not read earlier than the latest time this node has
//!   accepted metadata at (else the expiry checks would mean nothing).
//! - The record must be valid and for the node's channel.
//! - The current root must not have expired.
//! - A threshold of the current root's keys must have signed it.
//! - A version lower than the highest accepted is a rollback and refused. A
//!   *deliberate* rollback is a new release, with a higher version, that
//!   names the older bundle versions.
//! - The version already accepted is accepted again ("no change") only if
//!   it is the same record (the state keeps its digest); a different record
//!   under one version is refused, so each signed change needs a new one.
//! - A release whose expiry is at or before `now_ms` is refused: the caller
//!   reports a stale release and keeps applying what it has.
//! - On success the state keeps the version and the record's digest, and
//!   the latest known time becomes `max(latest, now_ms)`: it never moves
//!   back.
//!
//! Rotating the root ([`TrustState::accept_root`])
//! - The same clock guard; the new root must be valid, its version exactly
//!   the current version + 1 (a chain of rotations is applied one at a
//!   time, as TUF does), signed by a threshold of the *current* root's keys
//!   *and* a threshold of its *own* keys, and not expired. A key rotated
//!   out no longer counts toward any threshold, for releases or roots.
//!
//! Applying a bundle ([`Release::admits`]): the node's current release must
//! name exactly this bundle version, and its manifest digest must match.
//!
//! # Compared with TUF
//!
//! [`TrustRoot`] is TUF's root role, with the same rotation rule
//! (5.3.4: the new root is signed by the old root's threshold and its own).
//! [`Release`] is TUF's targets and snapshot roles in one: it names the
//! bundle versions (targets) and ties them into one consistent set with a
//! version (snapshot). One key set signs both roots and releases; delegated
//! targets roles are not modelled. TUF's timestamp role is not modelled
//! either: freshness comes from the release's own expiry, so the publisher
//! re-signs (with a new version) before it runs out. An online timestamp
//! key that re-signs a short-lived pointer to the current release is a later
//! option, for publishers who keep their release keys offline.
//!
//! What it defends against
//! - Rollback: a lower version than accepted is refused; the version is
//!   kept in the node's journal across restarts.
//! - Freeze (withholding newer releases): a release stops being accepted
//!   at its expiry, so a server that withholds newer ones leaves the node
//!   reporting a stale release rather than silently running old bundles.
//! - Mix-and-match: a node applies only a bundle version (and manifest
//!   digest) its current release names, so signed bundles from different
//!   releases cannot be combined.
//! - Fast-forward: versions can only be raised by a threshold of trusted
//!   keys, so a server cannot push the node to a version it then refuses to
//!   go back from. Recovering from a *compromised threshold* that did so is
//!   not modelled (it would need an operator to reset the journal).
//! - Clock tampering: a clock set back is refused instead of making expired
//!   records current again.
//! - Endless data: every count and string is bounded ([`crate::limits`]),
//!   and the byte limits let a decoder refuse a record before parsing it.
//!
//! [`MAX_RELEASE_BUNDLES`]: crate::limits::MAX_RELEASE_BUNDLES
//! [`MAX_ROOT_KEYS`]: crate::limits::MAX_ROOT_KEYS
//! [`MAX_SIGNATURES`]: crate::limits::MAX_SIGNATURES
//! [`MAX_RELEASE_BYTES`]: crate::limits::MAX_RELEASE_BYTES
//! [`MAX_ROOT_BYTES`]: crate::limits::MAX_ROOT_BYTES

mod error;
mod record;
mod signed;
mod state;
mod wire;

pub use error::TrustError;
pub use record::{RELEASE_DOMAIN, ROOT_DOMAIN, Release, ReleasedBundle, TrustRoot};
pub use signed::{KeySignature, SignedRelease, SignedRoot};
pub use state::TrustState;

#[cfg(test)]
mod tests;

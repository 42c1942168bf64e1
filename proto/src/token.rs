//! Bootstrap tokens, kubeadm style: `[a-z0-9]{6}.[a-z0-9]{16}`.
//!
//! The id (first part) is stored in clear and names the token; the secret is
//! stored only as its SHA-256. Tokens carry ~82 bits of entropy and expire,
//! so a fast hash is sufficient; comparison is constant-time on the server.

use std::fmt;
use std::str::FromStr;

use rand_core::{OsRng, RngCore};

use crate::digest::Digest;

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A parsed bootstrap token.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    id: String,
    secret: String,
}

impl BootstrapToken {
    /// A fresh random token.
    pub fn generate() -> Self {
        BootstrapToken {
            id: random_word(6),
            secret: random_word(16),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// What the server stores instead of the secret.
    pub fn secret_hash(&self) -> Digest {
        Digest::of(format!("lks-token-secret:{}", self.secret).as_bytes())
    }
}

fn random_word(len: usize) -> String {
    // Rejection sampling keeps the distribution uniform over 36 symbols.
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 1];
    while out.len() < len {
        OsRng.fill_bytes(&mut buf);
        if (buf[0] as usize) < 252 {
            out.push(ALPHABET[buf[0] as usize % 36] as char);
        }
    }
    out
}

/// A bootstrap token that is not `[a-z0-9]{6}.[a-z0-9]{16}`. It carries
/// nothing: the text may be a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid bootstrap token: expected the form abcdef.0123456789abcdef ([a-z0-9]{{6}}.[a-z0-9]{{16}})")]
pub struct MalformedToken;

impl FromStr for BootstrapToken {
    type Err = MalformedToken;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (id, secret) = s.split_once('.').ok_or(MalformedToken)?;
        let word = |w: &str, n: usize| w.len() == n && w.bytes().all(|b| ALPHABET.contains(&b));
        if !word(id, 6) || !word(secret, 16) {
            return Err(MalformedToken);
        }
        Ok(BootstrapToken {
            id: id.into(),
            secret: secret.into(),
        })
    }
}

impl fmt::Display for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.id, self.secret)
    }
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.<redacted>)", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_parse_round_trip() {
        let t = BootstrapToken::generate();
        let s = t.to_string();
        assert_eq!(s.len(), 23);
        assert_eq!(s.parse::<BootstrapToken>().unwrap(), t);
        assert!(!format!("{t:?}").contains(t.secret()));
        assert_ne!(BootstrapToken::generate(), t);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "abcdef",
            "abcdef.0123456789abcde",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdefg",
            "abcdef:0123456789abcdef",
            "abcdef.0123456789abcdef.x",
        ] {
            assert_eq!(bad.parse::<BootstrapToken>(), Err(MalformedToken), "{bad}");
        }
        assert_eq!(
            MalformedToken.to_string(),
            "invalid bootstrap token: expected the form abcdef.0123456789abcdef ([a-z0-9]{6}.[a-z0-9]{16})"
        );
    }
}

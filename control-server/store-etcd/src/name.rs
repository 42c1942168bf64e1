//! A string that documents in the watch-fed copy share (`cache.rs`): the
//! cluster a node belongs to is the same few names on 30,000 node
//! documents, and one allocation each would cost ~32 bytes a node.
//!
//! It is written and read exactly as a `String` is (a JSON string), so a
//! document holds the same bytes whichever type read it.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An immutable string, cheap to clone; equal to the `str` it holds.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<str>);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        Name(Arc::from(s))
    }
}

impl From<String> for Name {
    fn from(s: String) -> Self {
        Name(Arc::from(s))
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Self {
        Name(Arc::from(s.as_str()))
    }
}

impl From<Name> for String {
    fn from(n: Name) -> Self {
        n.0.to_string()
    }
}

impl From<&Name> for String {
    fn from(n: &Name) -> Self {
        n.0.to_string()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, o: &str) -> bool {
        *self.0 == *o
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, o: &&str) -> bool {
        *self.0 == **o
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, o: &String) -> bool {
        *self.0 == **o
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, o: &Name) -> bool {
        **self == *o.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, o: &Name) -> bool {
        **self == *o.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Name::from)
    }
}

/// The names a copy holds, each once.
#[derive(Default)]
pub struct Names(HashSet<Name>);

impl Names {
    /// The copy's own `n`: the one it already holds, or `n`, now held.
    pub fn intern(&mut self, n: &Name) -> Name {
        if let Some(held) = self.0.get(n.as_str()) {
            return held.clone();
        }
        self.0.insert(n.clone());
        n.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_reads_and_writes_the_bytes_a_string_does() {
        for json in [r#""""#, r#""c""#, r#""a \"quoted\" \u00e9 name""#] {
            let s: String = serde_json::from_str(json).unwrap();
            let n: Name = serde_json::from_str(json).unwrap();
            assert_eq!(
                serde_json::to_string(&n).unwrap(),
                serde_json::to_string(&s).unwrap()
            );
            assert_eq!(n, s);
        }
        assert!(serde_json::from_str::<Name>("1").is_err());
    }

    #[test]
    fn interned_names_share_one_allocation() {
        let mut names = Names::default();
        let a = names.intern(&Name::from("c"));
        let b = names.intern(&Name::from("c"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!((a.as_str(), &*b), ("c", "c"));
        assert!(!Arc::ptr_eq(&a.0, &names.intern(&Name::from("d")).0));
    }
}

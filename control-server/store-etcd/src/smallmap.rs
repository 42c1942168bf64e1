//! A map kept as a sorted vector, for what a node's documents hold per
//! bundle (one entry, or a few).
//!
//! Every replica's watch-fed copy holds every node document of the region,
//! not only those of its own agents (`cache.rs`). A `BTreeMap`'s first node
//! has room for 11 entries whatever it holds: about 1.3 KiB for a node's
//! reported bundles and 0.5 KiB for its desired ones, so at 30,000 nodes a
//! replica spent about 55 MiB on empty slots, some 5 KiB per agent it
//! serves. A sorted vector holds what is there.
//!
//! It is written and read exactly as a `BTreeMap<String, V>` is (a JSON
//! object, keys in order), so documents written before it, by it, and by
//! older replicas are the same bytes.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::name::{Name, Names};

/// Keys in order, each once. A boxed slice, not a vector: no spare
/// capacity, and 8 bytes fewer in each of the copy's node documents (it is
/// changed far less often than it is read). Keys are [`Name`]s, which the
/// copy shares between documents ([`SmallMap::intern`]): every node holds
/// the same few bundle names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmallMap<V>(Box<[(Name, V)]>);

impl<V> Default for SmallMap<V> {
    fn default() -> Self {
        SmallMap(Box::default())
    }
}

impl<V> SmallMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    fn find(&self, k: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(x, _)| x.as_str().cmp(k))
    }

    pub fn get(&self, k: &str) -> Option<&V> {
        self.find(k).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, k: &str) -> bool {
        self.find(k).is_ok()
    }

    /// Changes the entries with `f`, as a vector.
    fn edit<T>(&mut self, f: impl FnOnce(&mut Vec<(Name, V)>) -> T) -> T {
        let mut v = std::mem::take(&mut self.0).into_vec();
        let out = f(&mut v);
        self.0 = v.into_boxed_slice();
        out
    }

    /// Sets `k` to `v`; the value it had, if any.
    pub fn insert(&mut self, k: impl Into<Name>, v: V) -> Option<V> {
        let k = k.into();
        match self.find(&k) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, v)),
            Err(i) => {
                self.edit(|e| e.insert(i, (k, v)));
                None
            }
        }
    }

    pub fn remove(&mut self, k: &str) -> Option<V> {
        let i = self.find(k).ok()?;
        Some(self.edit(|e| e.remove(i).1))
    }

    /// In key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&str, &mut V) -> bool) {
        self.edit(|e| e.retain_mut(|(k, v)| keep(k, v)));
    }

    /// Its keys shared with the other holders of `names`, and each value
    /// made to share with `value`.
    pub fn intern(&mut self, names: &mut Names, mut value: impl FnMut(&mut Names, &mut V)) {
        for (k, v) in self.0.iter_mut() {
            *k = names.intern(k);
            value(names, v);
        }
    }

    /// From pairs in any order; of a key given twice the last counts, as
    /// with a `BTreeMap`.
    fn from_pairs(mut pairs: Vec<(Name, V)>) -> Self {
        // Stable: equal keys keep their order, and the last one is kept.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(Name, V)> = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = v,
                _ => out.push((k, v)),
            }
        }
        SmallMap(out.into_boxed_slice())
    }
}

impl<V: Clone> SmallMap<V> {
    pub fn to_btree(&self) -> BTreeMap<String, V> {
        self.0.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }
}

impl<K: Into<Name>, V> FromIterator<(K, V)> for SmallMap<V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self::from_pairs(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl<V> From<BTreeMap<String, V>> for SmallMap<V> {
    fn from(m: BTreeMap<String, V>) -> Self {
        // Already in order, each key once.
        SmallMap(m.into_iter().map(|(k, v)| (Name::from(k), v)).collect())
    }
}

impl From<BTreeMap<String, String>> for SmallMap<Name> {
    fn from(m: BTreeMap<String, String>) -> Self {
        // Already in order, each key once.
        SmallMap(
            m.into_iter()
                .map(|(k, v)| (Name::from(k), Name::from(v)))
                .collect(),
        )
    }
}

impl From<SmallMap<Name>> for BTreeMap<String, String> {
    fn from(m: SmallMap<Name>) -> Self {
        m.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
}

impl<V, const N: usize> From<[(String, V); N]> for SmallMap<V> {
    fn from(a: [(String, V); N]) -> Self {
        a.into_iter().collect()
    }
}

impl<V> IntoIterator for SmallMap<V> {
    type Item = (Name, V);
    type IntoIter = std::vec::IntoIter<(Name, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_vec().into_iter()
    }
}

impl<'a, V> IntoIterator for &'a SmallMap<V> {
    type Item = (&'a str, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (Name, V)>, fn(&'a (Name, V)) -> (&'a str, &'a V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl<V> From<SmallMap<V>> for BTreeMap<String, V> {
    fn from(m: SmallMap<V>) -> Self {
        m.0.into_vec()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }
}

impl<V> std::ops::Index<&str> for SmallMap<V> {
    type Output = V;
    fn index(&self, k: &str) -> &V {
        self.get(k).unwrap_or_else(|| panic!("no entry {k:?}"))
    }
}

impl<V: Serialize> Serialize for SmallMap<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for SmallMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Pairs<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Pairs<V> {
            type Value = SmallMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::with_capacity(a.size_hint().unwrap_or(0).min(64));
                while let Some((k, v)) = a.next_entry::<Name, V>()? {
                    pairs.push((k, v));
                }
                Ok(SmallMap::from_pairs(pairs))
            }
        }
        d.deserialize_map(Pairs(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_reads_and_writes_the_bytes_a_btreemap_does() {
        for json in [
            r#"{}"#,
            r#"{"a":"1"}"#,
            r#"{"zeta":"1","alpha":"2","mid":"3"}"#,
            r#"{"k":"1","k":"2"}"#,
        ] {
            let b: BTreeMap<String, String> = serde_json::from_str(json).unwrap();
            let s: SmallMap<String> = serde_json::from_str(json).unwrap();
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                serde_json::to_string(&b).unwrap(),
                "{json}"
            );
            assert_eq!(s.to_btree(), b, "{json}");
            assert_eq!(SmallMap::from(b.clone()), s, "{json}");
        }
        assert!(serde_json::from_str::<SmallMap<String>>("[1]").is_err());
    }

    #[test]
    fn it_behaves_as_a_map_in_key_order() {
        let mut m: SmallMap<u32> = [("b".to_string(), 2), ("a".to_string(), 1)].into();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(m.insert("c", 3), None);
        assert_eq!(m.insert("a", 10), Some(1));
        assert_eq!((m.get("a"), m["c"], m.get("x")), (Some(&10), 3, None));
        assert!(m.contains_key("b") && !m.contains_key("x"));
        assert_eq!(m.remove("b"), Some(2));
        assert_eq!(m.remove("b"), None);
        m.retain(|k, v| {
            *v += 1;
            k != "c"
        });
        assert_eq!(m.iter().collect::<Vec<_>>(), [("a", &11)]);
        assert_eq!((m.len(), m.is_empty()), (1, false));
        assert_eq!(m.into_iter().collect::<Vec<_>>(), [(Name::from("a"), 11)]);
        let from_iter: SmallMap<u32> = [("x".to_string(), 1), ("x".to_string(), 2)].into_iter().collect();
        assert_eq!(from_iter.to_btree(), BTreeMap::from([("x".to_string(), 2)]));
    }
}

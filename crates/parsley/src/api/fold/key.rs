//! [`FoldKey`]: how a fold's state key is laid out in its store.

/// A slot of the fold-state store.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum FoldKey {
    /// The null key's state.
    Null,
    /// The state of a key, by its encoded bytes.
    Key(Vec<u8>),
    /// The reserved tick-state slot.
    Ticks,
}

impl FoldKey {
    /// The slot of a record key (`None` is a null key).
    pub fn for_key(key: Option<&[u8]>) -> Self {
        match key {
            None => FoldKey::Null,
            Some(k) => FoldKey::Key(k.to_vec()),
        }
    }

    /// The store key bytes.
    ///
    /// ```
    /// use parsley::FoldKey;
    /// assert_eq!(FoldKey::Null.to_bytes(), vec![0x00]);
    /// assert_eq!(FoldKey::Key(b"k".to_vec()).to_bytes(), vec![0x01, b'k']);
    /// assert_eq!(FoldKey::Key(vec![]).to_bytes(), vec![0x01]);
    /// assert_eq!(FoldKey::Ticks.to_bytes(), vec![0x02]);
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            FoldKey::Key(k) => FoldKey::key_bytes(Some(k)),
            _ => {
                let mut out = Vec::with_capacity(1);
                self.write_bytes(&mut out);
                out
            }
        }
    }

    /// [`to_bytes`](Self::to_bytes) written over `out`, reusing its room.
    pub(crate) fn write_bytes(&self, out: &mut Vec<u8>) {
        match self {
            FoldKey::Null => FoldKey::write_key_bytes(None, out),
            FoldKey::Key(k) => FoldKey::write_key_bytes(Some(k), out),
            FoldKey::Ticks => {
                out.clear();
                out.push(0x02);
            }
        }
    }

    /// The store key bytes of a record key's slot (`None` is a null key):
    /// `FoldKey::for_key(key).to_bytes()` in one allocation instead of two.
    ///
    /// ```
    /// use parsley::FoldKey;
    /// assert_eq!(FoldKey::key_bytes(Some(b"k")), FoldKey::for_key(Some(b"k")).to_bytes());
    /// assert_eq!(FoldKey::key_bytes(None), FoldKey::Null.to_bytes());
    /// ```
    pub fn key_bytes(key: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::with_capacity(key.map_or(1, |k| k.len() + 1));
        FoldKey::write_key_bytes(key, &mut out);
        out
    }

    /// [`key_bytes`](Self::key_bytes) written over `out`, reusing its room.
    pub(crate) fn write_key_bytes(key: Option<&[u8]>, out: &mut Vec<u8>) {
        out.clear();
        match key {
            None => out.push(0x00),
            Some(k) => {
                out.push(0x01);
                out.extend_from_slice(k);
            }
        }
    }

    /// Parses store key bytes; `None` for bytes no slot produces.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [0x00] => Some(FoldKey::Null),
            [0x01, rest @ ..] => Some(FoldKey::Key(rest.to_vec())),
            [0x02] => Some(FoldKey::Ticks),
            _ => None,
        }
    }
}

//! [`StateView`]: what a fold handler sees of its stage's state.

use super::*;

/// The raw fold state a task shows its tick logic: committed state with
/// this task's uncommitted writes on top.
pub(crate) trait StateSource {
    /// The state bytes under a store key.
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>>;
    /// Every keyed slot (the null key's and each key's, not the tick
    /// slot), in store-key order.
    fn entries(&self) -> Vec<FoldEntry<'_>>;
    /// How many keys hold state (the null key included), as
    /// [`entries`](Self::entries) would list them. The default lists them;
    /// a source whose state may be on disk counts keys without reading
    /// any state.
    fn count(&self) -> usize {
        self.entries().len()
    }
}

/// A read view of a stateful stage's per-key fold state, as tick logic
/// declared with
/// [`tick_fold_over`](crate::StageBuilder::tick_fold_over) sees it: the
/// task's state including what earlier records of the same transaction
/// wrote. Iteration follows the encoded key bytes (the null key first), so a
/// run is deterministic; that order is not `K`'s own `Ord` in general.
///
/// A key or state that does not decode fails the task once the tick logic
/// returns (as a state codec error), and iteration stops at it.
pub struct StateView<'a, K, S> {
    source: &'a dyn StateSource,
    key: &'a Codec<K>,
    state: &'a Codec<S>,
    error: &'a RefCell<Option<CodecError>>,
}

impl<K, S> fmt::Debug for StateView<'_, K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateView")
            .field("slots", &self.source.count())
            .finish()
    }
}

impl<'a, K: 'static, S: 'static> StateView<'a, K, S> {
    pub(crate) fn new(
        source: &'a dyn StateSource,
        key: &'a Codec<K>,
        state: &'a Codec<S>,
        error: &'a RefCell<Option<CodecError>>,
    ) -> Self {
        StateView {
            source,
            key,
            state,
            error,
        }
    }

    fn fail(&self, e: CodecError) {
        let mut slot = self.error.borrow_mut();
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    fn decode_state(&self, bytes: &[u8]) -> Option<S> {
        match self.state.decode(bytes) {
            Ok(s) => Some(s),
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    /// The state of `key`, if it has any.
    pub fn get(&self, key: &K) -> Option<S> {
        let bytes = match self.key.encode(key) {
            Ok(b) => b,
            Err(e) => {
                self.fail(e);
                return None;
            }
        };
        let slot = FoldKey::Key(bytes).to_bytes();
        self.source.get(&slot).and_then(|b| self.decode_state(&b))
    }

    /// The null key's state, if it has any.
    pub fn get_null(&self) -> Option<S> {
        self.source
            .get(&FoldKey::Null.to_bytes())
            .and_then(|b| self.decode_state(&b))
    }

    /// Every key with state and its state (`None` for the null key), in
    /// encoded-key order.
    pub fn iter(&self) -> impl Iterator<Item = (Option<K>, S)> + '_ {
        self.source.entries().into_iter().map_while(move |(k, v)| {
            if self.error.borrow().is_some() {
                return None;
            }
            let key = match FoldKey::from_bytes(&k) {
                Some(FoldKey::Key(bytes)) => match self.key.decode(&bytes) {
                    Ok(key) => Some(key),
                    Err(e) => {
                        self.fail(e);
                        return None;
                    }
                },
                _ => None,
            };
            self.decode_state(&v).map(|s| (key, s))
        })
    }

    /// How many keys (the null key included) hold state. Counted without
    /// reading any state, also where most of it is on disk.
    pub fn len(&self) -> usize {
        self.source.count()
    }

    /// True when no key holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

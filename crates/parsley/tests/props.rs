//! Property tests of the pure pieces: codecs, fold keys, partitioning and
//! emission equality.

use parsley::partition::{partition_for, partition_for_key};
use parsley::*;
use proptest::prelude::*;

proptest! {
    #[test]
    fn builtin_codecs_round_trip(s in ".*", n in any::<i64>(), b in proptest::collection::vec(any::<u8>(), 0..64)) {
        let utf8 = Codec::utf8();
        prop_assert_eq!(utf8.decode(&utf8.encode(&s).unwrap()).unwrap(), s);
        let long = Codec::int64();
        prop_assert_eq!(long.decode(&long.encode(&n).unwrap()).unwrap(), n);
        let bytes = Codec::bytes();
        prop_assert_eq!(bytes.decode(&bytes.encode(&b).unwrap()).unwrap(), b);
    }

    #[test]
    fn fold_keys_round_trip(k in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16))) {
        let slot = FoldKey::for_key(k.as_deref());
        prop_assert_eq!(FoldKey::from_bytes(&slot.to_bytes()), Some(slot.clone()));
        prop_assert_ne!(slot.to_bytes(), FoldKey::Ticks.to_bytes());
    }

    #[test]
    fn partitions_are_in_range(k in proptest::collection::vec(any::<u8>(), 0..40), n in 1i32..500, task in 0i32..1000) {
        let p = partition_for_key(&k, n);
        prop_assert!((0..n).contains(&p));
        let q = partition_for(None, task, n);
        prop_assert!((0..n).contains(&q));
    }

    #[test]
    fn emissions_equal_exactly_when_parts_do(k1 in "[a-c]{0,2}", k2 in "[a-c]{0,2}", v1 in 0i64..3, v2 in 0i64..3) {
        let t: Topic<String, i64> = Topic::new("t", Codec::utf8(), Codec::int64());
        prop_assert_eq!(t.send(k1.clone(), v1) == t.send(k2.clone(), v2), k1 == k2 && v1 == v2);
    }
}

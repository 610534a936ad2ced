//! Topic ids through librdkafka's DescribeTopics, and a consumer group's
//! state through its DescribeConsumerGroups: the one module of this
//! workspace that calls C directly, because rdkafka has no safe wrapper for
//! either. Everything here is the call, the walk over its result, and the
//! releases, each documented at the call site.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char};
use std::time::Duration;

use parsley_protocol::TopicId;
use rdkafka::client::{Client, ClientContext};
use rdkafka_sys as sys;

/// What DescribeTopics said about one topic name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Described {
    /// The topic exists.
    Present {
        /// Its id.
        id: TopicId,
        /// Its partition count.
        partitions: i32,
    },
    /// The broker says the topic does not exist.
    Absent,
}

/// A DescribeTopics call that did not produce an answer.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("DescribeTopics failed: {0}")]
pub struct DescribeError(pub String);

/// Owns a librdkafka object and releases it with its destroy function.
struct Owned<T> {
    ptr: *mut T,
    destroy: unsafe extern "C" fn(*mut T),
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` came from the matching constructor, is owned by
            // this guard alone, and is released exactly once, here.
            unsafe { (self.destroy)(self.ptr) }
        }
    }
}

/// One admin request's life up to its answer: its options with the
/// request timeout, a queue, the request itself (`send`, given the options
/// and the queue), and the result event, checked for its type and for a
/// request-level error.
fn admin_request(
    rk: *mut sys::rd_kafka_t,
    op: sys::rd_kafka_admin_op_t,
    event_type: i32,
    timeout: Duration,
    send: impl FnOnce(*const sys::rd_kafka_AdminOptions_t, *mut sys::rd_kafka_queue_t),
) -> Result<Owned<sys::rd_kafka_event_t>, DescribeError> {
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `rk` is a live client handle (the caller's client owns it).
    let options = Owned {
        ptr: unsafe { sys::rd_kafka_AdminOptions_new(rk, op) },
        destroy: sys::rd_kafka_AdminOptions_destroy,
    };
    let mut errstr = [0 as c_char; 256];
    // SAFETY: `options` is live; `errstr` is a writable buffer of the size
    // passed.
    let set = unsafe {
        sys::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        )
    };
    if set != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        // SAFETY: librdkafka wrote a NUL-terminated message into `errstr`.
        let msg = unsafe { CStr::from_ptr(errstr.as_ptr()) };
        return Err(DescribeError(msg.to_string_lossy().into_owned()));
    }
    // SAFETY: `rk` is live; the queue is released by its guard.
    let queue = Owned {
        ptr: unsafe { sys::rd_kafka_queue_new(rk) },
        destroy: sys::rd_kafka_queue_destroy,
    };
    send(options.ptr, queue.ptr);
    // The request carries its own timeout; wait a little longer for the
    // event that reports it.
    // SAFETY: `queue` is live; the event is released by its guard.
    let event = Owned {
        ptr: unsafe { sys::rd_kafka_queue_poll(queue.ptr, timeout_ms.saturating_add(1_000)) },
        destroy: sys::rd_kafka_event_destroy,
    };
    if event.ptr.is_null() {
        return Err(DescribeError(format!("no answer within {timeout:?}")));
    }
    // SAFETY: `event` is live; its error string belongs to it.
    unsafe {
        if sys::rd_kafka_event_type(event.ptr) != event_type {
            return Err(DescribeError("unexpected event type".to_owned()));
        }
        if sys::rd_kafka_event_error(event.ptr)
            != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            let msg = sys::rd_kafka_event_error_string(event.ptr);
            let msg = if msg.is_null() {
                "request failed".to_owned()
            } else {
                CStr::from_ptr(msg).to_string_lossy().into_owned()
            };
            return Err(DescribeError(msg));
        }
    }
    Ok(event)
}

/// Describes `names` in one request. Every name is in the answer: present
/// with its id and partition count, or absent.
// The request's guards live in `admin_request`; the topic collection's
// and the event's guards live here, around every read of them.
pub fn describe<C: ClientContext>(
    client: &Client<C>,
    names: &[&str],
    timeout: Duration,
) -> Result<BTreeMap<String, Described>, DescribeError> {
    if names.is_empty() {
        return Ok(BTreeMap::new());
    }
    let c_names: Vec<CString> = names
        .iter()
        .map(|n| {
            CString::new(*n)
                .map_err(|_| DescribeError(format!("topic name {n:?} holds a NUL byte")))
        })
        .collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*const c_char> = c_names.iter().map(|c| c.as_ptr()).collect();
    let rk = client.native_ptr();

    // SAFETY: `ptrs` points at `ptrs.len()` NUL-terminated strings that
    // outlive the call; librdkafka copies them into the collection.
    let collection = Owned {
        ptr: unsafe { sys::rd_kafka_TopicCollection_of_topic_names(ptrs.as_mut_ptr(), ptrs.len()) },
        destroy: sys::rd_kafka_TopicCollection_destroy,
    };
    let event = admin_request(
        rk,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        sys::RD_KAFKA_EVENT_DESCRIBETOPICS_RESULT,
        timeout,
        // SAFETY: every pointer is live; librdkafka does not keep
        // `collection` or the options past the call, and answers on the
        // queue.
        |options, queue| unsafe {
            sys::rd_kafka_DescribeTopics(rk, collection.ptr, options, queue)
        },
    )?;
    // SAFETY: `event` is live until its guard drops, after every read below.
    unsafe {
        let result = sys::rd_kafka_event_DescribeTopics_result(event.ptr);
        if result.is_null() {
            return Err(DescribeError("event without a result".to_owned()));
        }
        let mut count = 0usize;
        let topics = sys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        let mut out = BTreeMap::new();
        for i in 0..count {
            // The array and each description belong to the event.
            let desc = *topics.add(i);
            let name_ptr = sys::rd_kafka_TopicDescription_name(desc);
            if name_ptr.is_null() {
                continue;
            }
            let name = CStr::from_ptr(name_ptr).to_string_lossy().into_owned();
            let error = sys::rd_kafka_TopicDescription_error(desc);
            if !error.is_null() {
                let code = sys::rd_kafka_error_code(error);
                if code == sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    // Not an error after all; fall through.
                } else if code == sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART
                {
                    out.insert(name, Described::Absent);
                    continue;
                } else {
                    let msg = sys::rd_kafka_error_string(error);
                    let msg = if msg.is_null() {
                        format!("{code:?}")
                    } else {
                        CStr::from_ptr(msg).to_string_lossy().into_owned()
                    };
                    return Err(DescribeError(format!("topic {name:?}: {msg}")));
                }
            }
            let uuid = sys::rd_kafka_TopicDescription_topic_id(desc);
            if uuid.is_null() {
                return Err(DescribeError(format!(
                    "topic {name:?} came back without an id"
                )));
            }
            let msb = sys::rd_kafka_Uuid_most_significant_bits(uuid);
            let lsb = sys::rd_kafka_Uuid_least_significant_bits(uuid);
            let mut partitions = 0usize;
            sys::rd_kafka_TopicDescription_partitions(desc, &mut partitions);
            out.insert(
                name,
                Described::Present {
                    id: TopicId::from_halves(msb, lsb),
                    partitions: i32::try_from(partitions).unwrap_or(i32::MAX),
                },
            );
        }
        for n in names {
            if !out.contains_key(*n) {
                return Err(DescribeError(format!("no answer for topic {n:?}")));
            }
        }
        Ok(out)
    }
}

/// A consumer group as the broker's coordinator describes it: under either
/// group protocol (librdkafka asks with ConsumerGroupDescribe for a group
/// of the consumer protocol, and DescribeGroups for a classic one).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GroupDescription {
    /// The group's state: `Stable`, `PreparingRebalance`,
    /// `CompletingRebalance`, `Empty`, `Dead` or `Unknown`.
    pub state: &'static str,
    /// `consumer` (KIP-848), `classic`, or `unknown`.
    pub protocol: &'static str,
    /// Its members' client ids (one per stream thread of a running
    /// instance).
    pub members: Vec<String>,
}

impl GroupDescription {
    /// Whether any member belongs to the group, or it is between states
    /// that only members cause (a rebalance in progress).
    pub fn is_active(&self) -> bool {
        !self.members.is_empty()
            || matches!(self.state, "PreparingRebalance" | "CompletingRebalance")
    }
}

/// Describes consumer group `group` through its coordinator. A group that
/// does not exist is described as `Dead` with no members.
pub fn describe_group<C: ClientContext>(
    client: &Client<C>,
    group: &str,
    timeout: Duration,
) -> Result<GroupDescription, DescribeError> {
    let c_group = CString::new(group)
        .map_err(|_| DescribeError(format!("group id {group:?} holds a NUL byte")))?;
    let mut ptrs: Vec<*const c_char> = vec![c_group.as_ptr()];
    let rk = client.native_ptr();
    let event = admin_request(
        rk,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
        sys::RD_KAFKA_EVENT_DESCRIBECONSUMERGROUPS_RESULT,
        timeout,
        // SAFETY: every pointer is live; librdkafka copies the group names
        // and does not keep the options past the call; it answers on the
        // queue.
        |options, queue| unsafe {
            sys::rd_kafka_DescribeConsumerGroups(rk, ptrs.as_mut_ptr(), ptrs.len(), options, queue)
        },
    )?;
    // SAFETY: `event` is live until its guard drops, after every read below;
    // the descriptions and their strings belong to it.
    unsafe {
        let result = sys::rd_kafka_event_DescribeConsumerGroups_result(event.ptr);
        if result.is_null() {
            return Err(DescribeError("event without a result".to_owned()));
        }
        let mut count = 0usize;
        let groups = sys::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
        for i in 0..count {
            let desc = *groups.add(i);
            let id = sys::rd_kafka_ConsumerGroupDescription_group_id(desc);
            if id.is_null() || CStr::from_ptr(id).to_bytes() != group.as_bytes() {
                continue;
            }
            let error = sys::rd_kafka_ConsumerGroupDescription_error(desc);
            if !error.is_null() {
                let code = sys::rd_kafka_error_code(error);
                if code == sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND {
                    return Ok(GroupDescription {
                        state: "Dead",
                        protocol: "unknown",
                        members: Vec::new(),
                    });
                }
                if code != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    let msg = sys::rd_kafka_error_string(error);
                    let msg = if msg.is_null() {
                        format!("{code:?}")
                    } else {
                        CStr::from_ptr(msg).to_string_lossy().into_owned()
                    };
                    return Err(DescribeError(format!("group {group:?}: {msg}")));
                }
            }
            use sys::rd_kafka_consumer_group_state_t as S;
            let state = match sys::rd_kafka_ConsumerGroupDescription_state(desc) {
                S::RD_KAFKA_CONSUMER_GROUP_STATE_PREPARING_REBALANCE => "PreparingRebalance",
                S::RD_KAFKA_CONSUMER_GROUP_STATE_COMPLETING_REBALANCE => "CompletingRebalance",
                S::RD_KAFKA_CONSUMER_GROUP_STATE_STABLE => "Stable",
                S::RD_KAFKA_CONSUMER_GROUP_STATE_DEAD => "Dead",
                S::RD_KAFKA_CONSUMER_GROUP_STATE_EMPTY => "Empty",
                _ => "Unknown",
            };
            use sys::rd_kafka_consumer_group_type_t as T;
            let protocol = match sys::rd_kafka_ConsumerGroupDescription_type(desc) {
                T::RD_KAFKA_CONSUMER_GROUP_TYPE_CONSUMER => "consumer",
                T::RD_KAFKA_CONSUMER_GROUP_TYPE_CLASSIC => "classic",
                _ => "unknown",
            };
            let n = sys::rd_kafka_ConsumerGroupDescription_member_count(desc);
            let mut members = Vec::with_capacity(n);
            for m in 0..n {
                let member = sys::rd_kafka_ConsumerGroupDescription_member(desc, m);
                if member.is_null() {
                    continue;
                }
                let client_id = sys::rd_kafka_MemberDescription_client_id(member);
                members.push(if client_id.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(client_id).to_string_lossy().into_owned()
                });
            }
            return Ok(GroupDescription {
                state,
                protocol,
                members,
            });
        }
        Err(DescribeError(format!("no answer for group {group:?}")))
    }
}

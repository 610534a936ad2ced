//! A held record's stored form (its envelope) and the pages that pack
//! several of them into one entry.

use super::*;

/// Encodes a held record's envelope. The record's channel is not part of the
/// value; it is in the key.
pub fn encode_envelope(record: &InboundRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(envelope_len(record));
    encode_envelope_into(record, &mut out);
    out
}

/// The bytes [`encode_envelope`] writes, exactly.
pub(super) fn envelope_len(record: &InboundRecord) -> usize {
    let headers = if record.headers.is_empty() {
        0
    } else {
        1 + 4
            + record
                .headers
                .iter()
                .map(|h| 8 + h.name.len() + h.value.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    };
    8 + 8
        + 1
        + 24
        + 4
        + record.causal.clock.encoded_len()
        + 8
        + record.key.as_ref().map_or(0, Vec::len)
        + record.value.as_ref().map_or(0, Vec::len)
        + headers
}

/// The most held records one page holds (see the [module docs](crate::store)).
pub const PAGE_RECORDS: usize = 256;

/// The most bytes a page's value takes, unless it holds a single record.
pub const PAGE_BYTES: usize = 64 * 1024;

/// Builds one page's value (see the [module docs](crate::store)).
#[derive(Clone, Debug)]
pub struct PageBuilder {
    bytes: Vec<u8>,
    count: usize,
}

impl Default for PageBuilder {
    fn default() -> Self {
        PageBuilder::new()
    }
}

impl PageBuilder {
    /// An empty page. It allocates nothing until its first record, which
    /// sizes the buffer exactly: most pages a commit writes while records
    /// trickle in hold one record, and growing a four-byte buffer to fit
    /// it cost a reallocation per page.
    pub fn new() -> Self {
        PageBuilder {
            bytes: Vec::new(),
            count: 0,
        }
    }

    /// Whether the page takes `record` as its next one: an empty page
    /// takes any record; otherwise the page must stay within
    /// [`PAGE_RECORDS`] and [`PAGE_BYTES`].
    pub fn fits(&self, record: &InboundRecord) -> bool {
        self.count == 0
            || (self.count < PAGE_RECORDS
                && self.bytes.len() + 4 + envelope_len(record) <= PAGE_BYTES)
    }

    /// Records in the page so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the page has no record yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends `record`'s envelope.
    pub fn push(&mut self, record: &InboundRecord) {
        if self.bytes.is_empty() {
            self.bytes.reserve_exact(4 + 4 + envelope_len(record));
            self.bytes.extend_from_slice(&[0; 4]);
        } else {
            self.bytes.reserve(4 + envelope_len(record));
        }
        let at = self.bytes.len();
        self.bytes.extend_from_slice(&[0; 4]);
        encode_envelope_into(record, &mut self.bytes);
        let len = (self.bytes.len() - at - 4) as i32;
        self.bytes[at..at + 4].copy_from_slice(&len.to_be_bytes());
        self.count += 1;
    }

    /// The page's value.
    pub fn finish(mut self) -> Vec<u8> {
        let count = self.count as i32;
        if self.bytes.is_empty() {
            self.bytes.extend_from_slice(&[0; 4]);
        }
        self.bytes[..4].copy_from_slice(&count.to_be_bytes());
        self.bytes
    }
}

/// The envelopes of one page, checked for shape when built: a count of at
/// least one, that many length-prefixed envelopes, nothing after them.
/// The envelopes themselves are decoded by whoever takes them.
#[derive(Clone, Debug)]
pub struct PageEntries<'a> {
    rest: Reader<'a>,
    left: usize,
}

impl<'a> PageEntries<'a> {
    /// Checks `bytes` as a page's value.
    pub fn new(bytes: &'a [u8]) -> Result<Self, String> {
        let mut r = Reader::new(bytes);
        let left = count(&mut r, 4, "page record")?;
        if left == 0 {
            return Err("a page without records".to_owned());
        }
        // Readers find the page that holds an index by looking at most
        // this far below it.
        if left > PAGE_RECORDS {
            return Err(format!("a page of {left} records (at most {PAGE_RECORDS})"));
        }
        let rest = r.clone();
        for at in 0..left {
            let len = need(r.i32())?;
            let len = usize::try_from(len)
                .map_err(|_| format!("page record {at} has negative length {len}"))?;
            r.take(len).ok_or_else(|| {
                format!(
                    "truncated page: record {at} claims {len} bytes, {} remain",
                    r.remaining()
                )
            })?;
        }
        finish(&r)?;
        Ok(PageEntries { rest, left })
    }

    /// Records in the page.
    pub fn count(bytes: &[u8]) -> Result<usize, String> {
        PageEntries::new(bytes).map(|p| p.left)
    }
}

impl<'a> Iterator for PageEntries<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let len = usize::try_from(self.rest.i32()?).ok()?;
        self.left -= 1;
        self.rest.take(len)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for PageEntries<'_> {}

/// Appends a held record's envelope to `out`.
pub fn encode_envelope_into(record: &InboundRecord, out: &mut Vec<u8>) {
    let clock_len = record.causal.clock.encoded_len();
    out.extend_from_slice(&record.offset.to_be_bytes());
    out.extend_from_slice(&record.timestamp.to_be_bytes());
    match record.causal.sender {
        Some(tag) => {
            out.push(1);
            out.extend_from_slice(&tag.sender.msb().to_be_bytes());
            out.extend_from_slice(&tag.sender.lsb().to_be_bytes());
            out.extend_from_slice(&tag.seq.to_be_bytes());
        }
        None => {
            out.push(0);
            out.extend_from_slice(&[0u8; 24]);
        }
    }
    out.extend_from_slice(&(clock_len as i32).to_be_bytes());
    record.causal.clock.encode_into(out);
    put_nullable(out, record.key.as_deref());
    put_nullable(out, record.value.as_deref());
    if !record.headers.is_empty() {
        out.push(ENVELOPE_HEADERS_EXTENSION);
        out.extend_from_slice(&(record.headers.len() as i32).to_be_bytes());
        for h in &record.headers {
            put_nullable(out, Some(h.name.as_bytes()));
            put_nullable(out, h.value.as_deref());
        }
    }
}

pub(super) fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => {
            out.extend_from_slice(&(b.len() as i32).to_be_bytes());
            out.extend_from_slice(b);
        }
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
    }
}

pub(super) fn get_nullable(r: &mut Reader<'_>, what: &str) -> Result<Option<Vec<u8>>, String> {
    let len = need(r.i32())?;
    match len {
        -1 => Ok(None),
        n if n < 0 => Err(format!("invalid {what} length {n}")),
        n => r.take(n as usize).map(|b| Some(b.to_vec())).ok_or_else(|| {
            format!(
                "truncated {what}: {n} bytes claimed, {} remain",
                r.remaining()
            )
        }),
    }
}

/// Decodes a held record's envelope for `channel`.
pub fn decode_envelope(channel: Channel, bytes: &[u8]) -> Result<InboundRecord, String> {
    let mut r = Reader::new(bytes);
    let offset = need(r.i64())?;
    if offset < 0 {
        return Err(format!("negative offset {offset}"));
    }
    let timestamp = need(r.i64())?;
    let tagged = need(r.u8())?;
    let msb = need(r.i64())?;
    let lsb = need(r.i64())?;
    let seq = need(r.i64())?;
    let sender = match tagged {
        0 if msb == 0 && lsb == 0 && seq == 0 => None,
        0 => return Err("untagged record with non-zero sender fields".to_owned()),
        1 => {
            if seq < 0 {
                return Err(format!("negative sender sequence {seq}"));
            }
            Some(SenderTag {
                sender: SenderId::from_halves(msb, lsb),
                seq,
            })
        }
        t => return Err(format!("invalid sender tag flag {t}")),
    };
    let clock_len = need(r.i32())?;
    if clock_len < 0 {
        return Err(format!("negative clock length {clock_len}"));
    }
    let clock_bytes = r
        .take(clock_len as usize)
        .ok_or_else(|| format!("truncated clock: {clock_len} bytes claimed"))?;
    let clock = VectorClock::decode(clock_bytes).map_err(|e| e.to_string())?;
    let key = get_nullable(&mut r, "key")?;
    let value = get_nullable(&mut r, "value")?;
    let mut headers = Vec::new();
    if r.remaining() > 0 {
        let tag = need(r.u8())?;
        if tag != ENVELOPE_HEADERS_EXTENSION {
            return Err(format!("unknown envelope extension {tag}"));
        }
        let n = count(&mut r, 8, "header")?;
        headers.reserve(n);
        for _ in 0..n {
            let name = get_nullable(&mut r, "header name")?
                .ok_or_else(|| "null header name".to_owned())?;
            let name =
                String::from_utf8(name).map_err(|_| "header name is not UTF-8".to_owned())?;
            let value = get_nullable(&mut r, "header value")?;
            headers.push(Header {
                name: name.into(),
                value,
            });
        }
        finish(&r)?;
    }
    Ok(InboundRecord {
        channel,
        offset,
        timestamp,
        key,
        value,
        headers,
        causal: CausalHeaders { clock, sender },
    })
}

/// Checks a held record's envelope without decoding it: `Ok` with the
/// record's offset and [`InboundRecord::held_size`] exactly when
/// [`decode_envelope`] would succeed, and its error otherwise. An envelope
/// as this library writes it is checked in one pass that allocates
/// nothing (a restore keeps held records as their envelopes and decodes
/// each one only at its release); anything else goes through the decoder,
/// so the reason given for a fault is the decoder's.
pub fn check_envelope(bytes: &[u8]) -> Result<(i64, usize), String> {
    match well_formed_envelope(bytes) {
        Some(checked) => Ok(checked),
        None => decode_envelope(Channel::new(TopicId::from_u128(0), 0), bytes)
            .map(|r| (r.offset, r.held_size())),
    }
}

/// The offset and held size of a well-formed envelope whose clock is
/// canonical, or `None` for anything else (every envelope
/// [`decode_envelope`] refuses among it).
pub(super) fn well_formed_envelope(bytes: &[u8]) -> Option<(i64, usize)> {
    fn nullable<'a>(r: &mut Reader<'a>) -> Option<Option<&'a [u8]>> {
        match r.i32()? {
            -1 => Some(None),
            n => r.take(usize::try_from(n).ok()?).map(Some),
        }
    }
    let len = |b: Option<&[u8]>| b.map_or(0, <[u8]>::len);
    let mut r = Reader::new(bytes);
    let offset = r.i64()?;
    r.i64()?;
    let (tagged, msb, lsb, seq) = (r.u8()?, r.i64()?, r.i64()?, r.i64()?);
    let sender_ok = match tagged {
        0 => msb == 0 && lsb == 0 && seq == 0,
        1 => seq >= 0,
        _ => false,
    };
    let clock_len = usize::try_from(r.i32()?).ok()?;
    if offset < 0 || !sender_ok {
        return None;
    }
    let (offsets, sequences) = VectorClock::claim_counts(r.take(clock_len)?).ok()?;
    let mut size = std::mem::size_of::<InboundRecord>()
        + offsets * std::mem::size_of::<OffsetClaim>()
        + sequences * std::mem::size_of::<SequenceClaim>()
        + len(nullable(&mut r)?)
        + len(nullable(&mut r)?);
    if r.remaining() > 0 {
        if r.u8()? != ENVELOPE_HEADERS_EXTENSION {
            return None;
        }
        let n = usize::try_from(r.i32()?).ok()?;
        if n.saturating_mul(8) > r.remaining() {
            return None;
        }
        for _ in 0..n {
            let name = std::str::from_utf8(nullable(&mut r)??).ok()?;
            // A decoded header owns its name, so its name counts.
            size += std::mem::size_of::<Header>() + name.len() + len(nullable(&mut r)?);
        }
        if r.remaining() > 0 {
            return None;
        }
    }
    Some((offset, size))
}

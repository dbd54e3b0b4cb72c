//! The dispatcher's records from the BSON of stored outbox entries (issue 42; docs/design.md
//! "The dispatcher", step 2): what `dispatcher.publishers.builder.RecordBuilder` returns for
//! the decoded entry — the same fields, header order and value bytes — without decoding the
//! page into Python objects first.
//!
//! Contract: `RecordMaker.build(entry_bson, document_id)` returns the record RecordBuilder
//! builds for `bson.decode(entry_bson, tz_aware)`, or `None` for anything this code does not
//! prove the same (then the caller decodes the entry and takes RecordBuilder, which itself
//! falls back to the reference). It accepts a subset of RecordBuilder's fast path: string
//! ids that `id_ok` accepts (ASCII ends), a `source` with an int32 `seq`, a payload of
//! strings, int32s, finite doubles, booleans, nulls, documents and arrays (no duplicate
//! keys), `created_at` a BSON date, headers of strings, an int32 `schema_version`; a
//! timer, an int64, a Decimal128, a date in the payload … take Python's way.
//! `outbox_of(document_bson)` splits a document read as raw BSON into its `_id`, `_type`,
//! `_p` and its outbox entries' ids and bytes. `BsonEntry` is the stored entry of a record
//! (a read-only mapping, decoded with `bson.decode` on first use).

use crate::push_i64;
use std::collections::HashMap;
use std::sync::OnceLock;

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDateTime, PyDict, PyList, PyString, PyTuple, PyTzInfo};

const MAX_ID_CHARS: usize = 512;
const MAX_WALK_DEPTH: u32 = 60;
const FLAT_MAX: usize = 16;
const CACHE_CAP: usize = 8192;
const HEX: &[u8; 16] = b"0123456789abcdef";

/// What the Python side registers once (`records_init`).
struct Shared {
    record_type: Py<PyAny>,
    /// the member descriptors of OutboundRecord's fields, in field order
    setters: Vec<Py<PyAny>>,
    /// their slots' offsets in the object (each a plain object slot), when all are
    offsets: Option<Vec<isize>>,
    render_topic: Py<PyAny>,
    utc: Py<PyAny>,
    decode: Py<PyAny>,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

fn shared() -> PyResult<&'static Shared> {
    SHARED.get().ok_or_else(|| PyRuntimeError::new_err("_aggbox_native.records_init was not called"))
}

const FIELDS: [&str; 11] = [
    "message_id", "collection", "document_id", "source_type", "topic", "key", "value",
    "headers", "envelope", "created_at", "entry",
];

#[pyfunction]
fn records_init(
    py: Python<'_>,
    record_type: Bound<'_, PyAny>,
    render_topic: Bound<'_, PyAny>,
    utc: Bound<'_, PyAny>,
    decode: Bound<'_, PyAny>,
) -> PyResult<()> {
    let dict = record_type.getattr("__dict__")?;
    let mut setters = Vec::with_capacity(FIELDS.len());
    let mut offsets = Some(Vec::with_capacity(FIELDS.len()));
    let member_type = py.import("types")?.getattr("MemberDescriptorType")?;
    for name in FIELDS {
        let d = dict.get_item(name)?;
        // A slot's member descriptor (T_OBJECT_EX): its offset, filled directly.
        if d.get_type().is(&member_type) {
            let off = unsafe {
                let m = (*(d.as_ptr() as *mut ffi::PyMemberDescrObject)).d_member
                    as *mut ffi::PyMemberDef;
                if (*m).type_code == ffi::Py_T_OBJECT_EX && (*m).flags == 0 {
                    Some((*m).offset)
                } else {
                    None
                }
            };
            match (off, offsets.as_mut()) {
                (Some(o), Some(v)) => v.push(o),
                _ => offsets = None,
            }
        } else {
            offsets = None;
        }
        setters.push(d.unbind());
    }
    let _ = SHARED.set(Shared {
        record_type: record_type.unbind(),
        setters,
        offsets,
        render_topic: render_topic.unbind(),
        utc: utc.unbind(),
        decode: decode.unbind(),
    });
    let _ = py;
    Ok(())
}

// ---------------------------------------------------------------- BSON reading

#[derive(Clone, Copy)]
enum V<'a> {
    Double(f64),
    /// a string's bytes, UTF-8 not checked yet (:func:`utf8`)
    Str(&'a [u8]),
    Doc(&'a [u8]),
    Arr(&'a [u8]),
    Bool(bool),
    Null,
    Int32(i32),
    Int64,
    Date(i64),
    Other,
}

/// The elements of one BSON document; `Err` for anything malformed.
struct Elems<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn i32_at(b: &[u8], at: usize) -> Result<i32, ()> {
    let s = b.get(at..at + 4).ok_or(())?;
    Ok(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn i64_at(b: &[u8], at: usize) -> Result<i64, ()> {
    let s = b.get(at..at + 8).ok_or(())?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(i64::from_le_bytes(a))
}

fn elems(doc: &[u8]) -> Result<Elems<'_>, ()> {
    let n = i32_at(doc, 0)?;
    if n < 5 || n as usize != doc.len() || doc[doc.len() - 1] != 0 {
        return Err(());
    }
    Ok(Elems { buf: doc, pos: 4 })
}

impl<'a> Elems<'a> {
    fn cstring(&mut self) -> Result<&'a [u8], ()> {
        let start = self.pos;
        let rel = self.buf[start..].iter().position(|&b| b == 0).ok_or(())?;
        self.pos = start + rel + 1;
        Ok(&self.buf[start..start + rel])
    }

    fn string(&mut self) -> Result<&'a [u8], ()> {
        let n = i32_at(self.buf, self.pos)?;
        if n < 1 {
            return Err(());
        }
        let start = self.pos + 4;
        let end = start + n as usize;
        if end > self.buf.len() || self.buf[end - 1] != 0 {
            return Err(());
        }
        self.pos = end;
        Ok(&self.buf[start..end - 1])
    }

    fn sub(&mut self) -> Result<&'a [u8], ()> {
        let n = i32_at(self.buf, self.pos)?;
        if n < 5 {
            return Err(());
        }
        let end = self.pos + n as usize;
        if end > self.buf.len() {
            return Err(());
        }
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn skip(&mut self, n: usize) -> Result<(), ()> {
        if self.pos + n > self.buf.len() {
            return Err(());
        }
        self.pos += n;
        Ok(())
    }

    /// The next (key, value), `None` at the end.
    fn next(&mut self) -> Result<Option<(&'a [u8], V<'a>)>, ()> {
        if self.pos >= self.buf.len() - 1 {
            return Ok(None);
        }
        let t = self.buf[self.pos];
        self.pos += 1;
        let key = self.cstring()?;
        let v = match t {
            0x01 => {
                let bits = i64_at(self.buf, self.pos)? as u64;
                self.pos += 8;
                V::Double(f64::from_bits(bits))
            }
            0x02 => V::Str(self.string()?),
            0x03 => V::Doc(self.sub()?),
            0x04 => V::Arr(self.sub()?),
            0x05 => {
                let n = i32_at(self.buf, self.pos)?;
                if n < 0 {
                    return Err(());
                }
                self.skip(5 + n as usize)?;
                V::Other
            }
            0x06 | 0xff | 0x7f => V::Other,
            0x07 => {
                self.skip(12)?;
                V::Other
            }
            0x08 => {
                let b = *self.buf.get(self.pos).ok_or(())?;
                self.pos += 1;
                match b {
                    0 => V::Bool(false),
                    1 => V::Bool(true),
                    _ => return Err(()),
                }
            }
            0x09 => {
                let ms = i64_at(self.buf, self.pos)?;
                self.pos += 8;
                V::Date(ms)
            }
            0x0a => V::Null,
            0x0b => {
                self.cstring()?;
                self.cstring()?;
                V::Other
            }
            0x0c => {
                self.string()?;
                self.skip(12)?;
                V::Other
            }
            0x0d | 0x0e => {
                self.string()?;
                V::Other
            }
            0x0f => {
                self.sub()?;
                V::Other
            }
            0x10 => {
                let v = i32_at(self.buf, self.pos)?;
                self.pos += 4;
                V::Int32(v)
            }
            0x11 => {
                self.skip(8)?;
                V::Other
            }
            0x12 => {
                self.skip(8)?;
                V::Int64
            }
            0x13 => {
                self.skip(16)?;
                V::Other
            }
            _ => return Err(()),
        };
        Ok(Some((key, v)))
    }
}

/// A BSON string's text (pymongo refuses invalid UTF-8: left to Python).
fn utf8(b: &[u8]) -> Option<&str> {
    if b.is_ascii() {
        // ASCII is UTF-8
        return Some(unsafe { std::str::from_utf8_unchecked(b) });
    }
    std::str::from_utf8(b).ok()
}

/// The elements of a document as (key, value), `None` when malformed or a key repeats
/// (a dict keeps the first position and the last value: left to Python).
fn items(doc: &[u8]) -> Option<Vec<(&[u8], V<'_>)>> {
    let mut it = elems(doc).ok()?;
    let mut out: Vec<(&[u8], V<'_>)> = Vec::new();
    while let Some((k, v)) = it.next().ok()? {
        if out.len() < 24 {
            if out.iter().any(|(seen, _)| *seen == k) {
                return None;
            }
        } else if out.len() == 24 {
            let mut keys: Vec<&[u8]> = out.iter().map(|(s, _)| *s).collect();
            keys.sort_unstable();
            if keys.windows(2).any(|w| w[0] == w[1]) || keys.binary_search(&k).is_ok() {
                return None;
            }
        }
        out.push((k, v));
    }
    if out.len() > 24 {
        let mut keys: Vec<&[u8]> = out.iter().map(|(s, _)| *s).collect();
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return None;
        }
    }
    Some(out)
}

/// An entry's top-level field by name (the last one: a dict keeps the last value).
fn field<'a>(entry: &[(&[u8], V<'a>)], name: &[u8]) -> Option<V<'a>> {
    entry.iter().rev().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

// ---------------------------------------------------------------- field rules

/// `aggregates.message.fastpath.id_ok(value, True)` for a BSON string; `false` also where
/// only Python could tell (a non-ASCII first or last character: `str.strip()`'s white
/// space).
fn id_ok(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || b.contains(&0) {
        return false;
    }
    let (first, last) = (b[0], b[b.len() - 1]);
    if first >= 0x80 || last >= 0x80 || is_py_space(first) || is_py_space(last) {
        return false;
    }
    let chars = if s.is_ascii() { b.len() } else { s.chars().count() };
    chars <= MAX_ID_CHARS
}

/// ASCII characters `str.isspace()` calls white space.
fn is_py_space(b: u8) -> bool {
    matches!(b, 9..=13 | 28..=32)
}

// ---------------------------------------------------------------- JSON

/// json's `encode_basestring` (ensure_ascii=False): `"`, `\`, `\b\f\n\r\t` by letter, the
/// other control characters as `\u00xx`; everything else as it is.
fn json_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    if b.iter().all(|&c| c >= 0x20 && c != b'"' && c != b'\\') {
        out.reserve(b.len() + 2);
        out.push(b'"');
        out.extend_from_slice(b);
        out.push(b'"');
        return;
    }
    out.push(b'"');
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        if c >= 0x20 && c != b'"' && c != b'\\' {
            continue;
        }
        out.extend_from_slice(&b[start..i]);
        start = i + 1;
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(c >> 4) as usize],
                                         HEX[(c & 15) as usize]]),
        }
    }
    out.extend_from_slice(&b[start..]);
    out.push(b'"');
}

/// `float.__repr__` of a finite double, as lib.rs's canonical JSON writes it.
fn push_float(out: &mut Vec<u8>, x: f64) {
    crate::encode_float(out, x)
}

/// A payload key `plain_payload` accepts: not `$…`, no `.` (BSON keys hold no NUL).
fn key_ok(k: &[u8]) -> Option<&str> {
    if k.first() == Some(&b'$') || k.contains(&b'.') {
        return None;
    }
    std::str::from_utf8(k).ok()
}

/// A payload value as the JSON encoder writes it and as a Python object (the envelope's
/// payload); `None` for what `plain_payload` refuses or this code leaves to Python.
/// Payload keys seen (few distinct ones, on every entry): one Python string each.
type Keys = HashMap<Vec<u8>, Py<PyString>, Fx>;

fn key_str<'py>(py: Python<'py>, keys: &mut Keys, k: &str) -> Bound<'py, PyString> {
    if let Some(o) = keys.get(k.as_bytes()) {
        return o.bind(py).clone();
    }
    if keys.len() >= CACHE_CAP {
        keys.clear();
    }
    let o = PyString::new(py, k);
    keys.insert(k.as_bytes().to_vec(), o.clone().unbind());
    o
}

fn value<'py>(py: Python<'py>, keys: &mut Keys, out: &mut Vec<u8>, v: V<'_>, depth: u32)
              -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(Some(match v {
        V::Str(b) => {
            let Some(s) = utf8(b) else { return Ok(None) };
            json_str(out, s);
            PyString::new(py, s).into_any()
        }
        V::Int32(i) => {
            push_i64(out, i as i64);
            i.into_pyobject(py)?.into_any()
        }
        V::Double(x) => {
            if !x.is_finite() {
                return Ok(None);
            }
            push_float(out, x);
            x.into_pyobject(py)?.into_any()
        }
        V::Bool(b) => {
            out.extend_from_slice(if b { b"true" } else { b"false" });
            pyo3::types::PyBool::new(py, b).to_owned().into_any()
        }
        V::Null => {
            out.extend_from_slice(b"null");
            py.None().into_bound(py)
        }
        V::Doc(d) => match object(py, keys, out, d, depth + 1)? {
            Some(o) => o.into_any(),
            None => return Ok(None),
        },
        V::Arr(a) => match array(py, keys, out, a, depth + 1)? {
            Some(o) => o.into_any(),
            None => return Ok(None),
        },
        _ => return Ok(None),
    }))
}

fn object<'py>(py: Python<'py>, keys: &mut Keys, out: &mut Vec<u8>, doc: &[u8], depth: u32)
               -> PyResult<Option<Bound<'py, PyDict>>> {
    if depth > MAX_WALK_DEPTH {
        return Ok(None);
    }
    let Some(fields) = items(doc) else { return Ok(None) };
    let dict = dict_for(py, fields.len() as isize)?;
    out.push(b'{');
    for (i, (k, v)) in fields.into_iter().enumerate() {
        let Some(key) = key_ok(k) else { return Ok(None) };
        if i > 0 {
            out.push(b',');
        }
        json_str(out, key);
        out.push(b':');
        let Some(item) = value(py, keys, out, v, depth)? else { return Ok(None) };
        dict.set_item(key_str(py, keys, key), item)?;
    }
    out.push(b'}');
    Ok(Some(dict))
}

fn array<'py>(py: Python<'py>, keys: &mut Keys, out: &mut Vec<u8>, arr: &[u8], depth: u32)
              -> PyResult<Option<Bound<'py, PyList>>> {
    if depth > MAX_WALK_DEPTH {
        return Ok(None);
    }
    let mut it = elems(arr).map_err(|_| PyRuntimeError::new_err("bad array"))
        .ok();
    let Some(ref mut it) = it else { return Ok(None) };
    let list = PyList::empty(py);
    out.push(b'[');
    let mut i = 0;
    loop {
        let next = match it.next() {
            Ok(n) => n,
            Err(()) => return Ok(None),
        };
        let Some((_, v)) = next else { break };
        if i > 0 {
            out.push(b',');
        }
        let Some(item) = value(py, keys, out, v, depth)? else { return Ok(None) };
        list.append(item)?;
        i += 1;
    }
    out.push(b']');
    Ok(Some(list))
}

// ---------------------------------------------------------------- dates

/// UTC civil date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

struct Civil {
    year: i32,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
    micro: u32,
}

/// A BSON date (ms since the epoch) as pymongo decodes it (tz-aware UTC); `None` outside
/// 1..=9999 (pymongo raises there: Python's way).
fn date_of(ms: i64) -> Option<Civil> {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000) as u32;
    let (y, m, d) = civil(secs.div_euclid(86_400));
    if !(1..=9999).contains(&y) {
        return None;
    }
    let sod = secs.rem_euclid(86_400);
    Some(Civil { year: y as i32, month: m as u8, day: d as u8, hour: (sod / 3600) as u8,
                 minute: (sod / 60 % 60) as u8, second: (sod % 60) as u8, micro: milli * 1000 })
}

/// `datetime.isoformat()` of a UTC-aware datetime.
fn iso(c: &Civil) -> String {
    let mut s = format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", c.year, c.month, c.day, c.hour,
                        c.minute, c.second);
    if c.micro != 0 {
        s.push_str(&format!(".{:06}", c.micro));
    }
    s.push_str("+00:00");
    s
}

// ---------------------------------------------------------------- the maker

/// FxHash (rustc's): the string caches' keys are short, trusted and hashed per entry; the
/// default SipHash was a tenth of the record's cost.
#[derive(Default, Clone, Copy)]
struct Fx;

#[derive(Default)]
struct FxHasher(u64);

impl std::hash::BuildHasher for Fx {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher(0)
    }
}

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            h = (h.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
        self.0 = h;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A dict with room for `n` items (no resize while it is filled).
fn dict_for<'py>(py: Python<'py>, n: isize) -> PyResult<Bound<'py, PyDict>> {
    unsafe {
        let d = ffi::_PyDict_NewPresized(n);
        if d.is_null() {
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, d).cast_into_unchecked())
    }
}

/// An ordered string map with dict assignment semantics (a key set again keeps its place).
struct Ordered<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Ordered<'a> {
    fn set(&mut self, k: &'a str, v: &'a str) {
        if let Some(slot) = self.0.iter_mut().find(|(key, _)| *key == k) {
            slot.1 = v;
        } else {
            self.0.push((k, v));
        }
    }
}

#[pyclass(module = "_aggbox_native")]
struct RecordMaker {
    collection: Py<PyString>,
    topic_template: Py<PyString>,
    /// strings seen (types, ids, names): one Python object each
    strings: HashMap<Vec<u8>, Py<PyString>, Fx>,
    /// topics by "emitter type\0target type\0message type"
    topics: HashMap<Vec<u8>, Py<PyString>, Fx>,
    keybuf: Vec<u8>,
    /// payload keys
    keys: Keys,
    /// the last created_at: (ms, datetime, ISO form)
    last_at: Option<(i64, Py<PyAny>, Py<PyString>, String)>,
}

impl RecordMaker {
    fn string<'py>(&mut self, py: Python<'py>, s: &str) -> Bound<'py, PyString> {
        if let Some(o) = self.strings.get(s.as_bytes()) {
            return o.bind(py).clone();
        }
        if self.strings.len() >= CACHE_CAP {
            self.strings.clear();
        }
        let o = PyString::new(py, s);
        self.strings.insert(s.as_bytes().to_vec(), o.clone().unbind());
        o
    }
}

/// An entry's fields, by name (the last one of a name: a dict keeps the last value).
#[derive(Default)]
struct Fields<'a> {
    id: Option<V<'a>>,
    type_: Option<V<'a>>,
    payload: Option<V<'a>>,
    source: Option<V<'a>>,
    created_at: Option<V<'a>>,
    target: Option<V<'a>>,
    correlation_id: Option<V<'a>>,
    causation_id: Option<V<'a>>,
    headers: Option<V<'a>>,
    schema_version: Option<V<'a>>,
    topic: Option<V<'a>>,
    key: Option<V<'a>>,
    timer: bool,
}

impl<'a> Fields<'a> {
    fn of(raw: &'a [u8]) -> Option<Fields<'a>> {
        let mut it = elems(raw).ok()?;
        let mut f = Fields::default();
        while let Some((k, v)) = it.next().ok()? {
            let slot = match k {
                b"id" => &mut f.id,
                b"type" => &mut f.type_,
                b"payload" => &mut f.payload,
                b"source" => &mut f.source,
                b"created_at" => &mut f.created_at,
                b"target" => &mut f.target,
                b"correlation_id" => &mut f.correlation_id,
                b"causation_id" => &mut f.causation_id,
                b"headers" => &mut f.headers,
                b"schema_version" => &mut f.schema_version,
                b"topic" => &mut f.topic,
                b"key" => &mut f.key,
                b"timer" => {
                    f.timer = true;
                    continue;
                }
                _ => continue,
            };
            *slot = Some(v);
        }
        Some(f)
    }
}

fn opt_str<'a>(v: Option<V<'a>>) -> Result<Option<&'a str>, ()> {
    match v {
        None | Some(V::Null) => Ok(None),
        Some(V::Str(b)) => utf8(b).map(Some).ok_or(()),
        _ => Err(()),
    }
}

fn text(v: Option<V<'_>>) -> Option<&str> {
    match v {
        Some(V::Str(b)) => utf8(b),
        _ => None,
    }
}

#[pymethods]
impl RecordMaker {
    #[new]
    fn new(collection: Bound<'_, PyString>, topic_template: Bound<'_, PyString>) -> Self {
        RecordMaker {
            collection: collection.unbind(),
            topic_template: topic_template.unbind(),
            strings: HashMap::default(),
            topics: HashMap::default(),
            keybuf: Vec::new(),
            keys: HashMap::default(),
            last_at: None,
        }
    }

    /// The record of one entry (its BSON) of the document `document_id`, or `None`.
    fn build<'py>(&mut self, py: Python<'py>, entry: &Bound<'py, PyBytes>,
                  document_id: Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let raw = entry.as_bytes();
        let Some(fields) = Fields::of(raw) else { return Ok(None) };
        if fields.timer {
            return Ok(None);
        }
        let (Some(eid), Some(etype), Some(V::Doc(payload)), Some(V::Doc(src)),
             Some(V::Date(created_ms))) = (text(fields.id),
                                           text(fields.type_),
                                           fields.payload, fields.source,
                                           fields.created_at)
        else {
            return Ok(None);
        };
        let Some(srcf) = elems(src).ok().and_then(|mut it| {
            let mut v = Vec::with_capacity(3);
            loop {
                match it.next() {
                    Ok(Some(kv)) => v.push(kv),
                    Ok(None) => return Some(v),
                    Err(()) => return None,
                }
            }
        }) else {
            return Ok(None);
        };
        let (Some(stype), Some(sid), Some(V::Int32(seq))) =
            (text(field(&srcf, b"type")), text(field(&srcf, b"id")), field(&srcf, b"seq"))
        else {
            return Ok(None);
        };
        if seq < 1 {
            return Ok(None);
        }
        let (agg_type, agg_id, addressed) = match fields.target {
            None | Some(V::Null) => (stype, sid, false),
            Some(V::Doc(t)) => {
                let Some(tf) = items(t) else { return Ok(None) };
                match (text(field(&tf, b"type")), text(field(&tf, b"id"))) {
                    (Some(tt), Some(ti)) if !tt.is_empty() => (tt, ti, true),
                    _ => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let (Ok(corr), Ok(caus)) = (opt_str(fields.correlation_id),
                                    opt_str(fields.causation_id))
        else {
            return Ok(None);
        };
        if !(id_ok(eid) && id_ok(etype) && id_ok(stype) && id_ok(sid) && id_ok(agg_type)
             && id_ok(agg_id) && corr.map_or(true, id_ok) && caus.map_or(true, id_ok)) {
            return Ok(None);
        }
        let headers: Vec<(&str, &str)> = match fields.headers {
            None | Some(V::Null) => Vec::new(),
            Some(V::Doc(h)) => {
                let Some(hf) = items(h) else { return Ok(None) };
                let mut out = Vec::with_capacity(hf.len());
                for (k, v) in hf {
                    let (Some(k), V::Str(v)) = (utf8(k), v) else { return Ok(None) };
                    let Some(v) = utf8(v) else { return Ok(None) };
                    if k.starts_with('$') {
                        return Ok(None);
                    }
                    out.push((k, v));
                }
                out
            }
            _ => return Ok(None),
        };
        let sv: Option<i32> = match fields.schema_version {
            None | Some(V::Null) => None,
            Some(V::Int32(v)) if v >= 1 => Some(v),
            _ => return Ok(None),
        };
        let topic = match fields.topic {
            None | Some(V::Null) => None,
            Some(V::Str(t)) if t.is_empty() => None,
            Some(V::Str(t)) => match utf8(t) {
                Some(t) => Some(t),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        let key = match fields.key {
            None | Some(V::Null) => None,
            Some(V::Str(k)) if k.is_empty() => None,
            Some(V::Str(k)) => match utf8(k) {
                Some(k) => Some(k),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        let Some(when) = date_of(created_ms) else { return Ok(None) };

        // The payload: its JSON and its Python form.
        let mut pjson = Vec::with_capacity(payload.len() + 16);
        let Some(payload_obj) = object(py, &mut self.keys, &mut pjson, payload, 0)? else {
            return Ok(None);
        };
        let _ = FLAT_MAX;

        let sh = shared()?;
        // created_at and its ISO form (one per write, shared by its entries)
        let (created, at_str) = match &self.last_at {
            Some((ms, dt, s, _)) if *ms == created_ms => (dt.bind(py).clone(), s.bind(py).clone()),
            _ => {
                let tz = sh.utc.bind(py).cast::<PyTzInfo>()?.clone();
                let dt = PyDateTime::new(py, when.year, when.month, when.day, when.hour,
                                         when.minute, when.second, when.micro, Some(&tz))?;
                let text = iso(&when);
                let s = PyString::new(py, &text);
                self.last_at = Some((created_ms, dt.clone().into_any().unbind(),
                                     s.clone().unbind(), text));
                (dt.into_any(), s)
            }
        };
        let at: &str = match &self.last_at {
            Some((_, _, _, text)) => text,
            None => "",
        };
        let at = at.to_owned();

        // env headers: the entry's, then aggbox-kind: event when not addressed
        let mut env_headers = Ordered(headers.clone());
        if !addressed && !headers.is_empty() {
            env_headers.set("aggbox-kind", "event");
        }
        // the value
        let mut v = Vec::with_capacity(pjson.len() + 256 + raw.len() / 2);
        v.extend_from_slice(b"{\"message_id\":");
        json_str(&mut v, eid);
        v.extend_from_slice(b",\"type\":");
        json_str(&mut v, etype);
        v.extend_from_slice(b",\"aggregate_type\":");
        json_str(&mut v, agg_type);
        v.extend_from_slice(b",\"aggregate_id\":");
        json_str(&mut v, agg_id);
        v.extend_from_slice(b",\"payload\":");
        v.extend_from_slice(&pjson);
        v.extend_from_slice(b",\"occurred_at\":\"");
        v.extend_from_slice(at.as_bytes());
        v.extend_from_slice(b"\",\"source\":{\"type\":");
        json_str(&mut v, stype);
        v.extend_from_slice(b",\"id\":");
        json_str(&mut v, sid);
        v.extend_from_slice(b",\"seq\":");
        push_i64(&mut v, seq as i64);
        v.push(b'}');
        if let Some(c) = corr {
            v.extend_from_slice(b",\"correlation_id\":");
            json_str(&mut v, c);
        }
        if let Some(c) = caus {
            v.extend_from_slice(b",\"causation_id\":");
            json_str(&mut v, c);
        }
        if !headers.is_empty() {
            v.extend_from_slice(b",\"headers\":{");
            for (i, (k, val)) in env_headers.0.iter().enumerate() {
                if i > 0 {
                    v.push(b',');
                }
                json_str(&mut v, k);
                v.push(b':');
                json_str(&mut v, val);
            }
            v.push(b'}');
        }
        if let Some(n) = sv {
            if n != 1 {
                v.extend_from_slice(b",\"schema_version\":");
                push_i64(&mut v, n as i64);
            }
        }
        if headers.is_empty() && !addressed {
            v.extend_from_slice(b",\"headers\":{\"aggbox-kind\":\"event\"}");
        }
        v.push(b'}');

        // Python objects
        let eid_o = PyString::new(py, eid);
        let etype_o = self.string(py, etype);
        let stype_o = self.string(py, stype);
        let sid_o = self.string(py, sid);
        let agg_type_o = self.string(py, agg_type);
        let agg_id_o = self.string(py, agg_id);
        let corr_o = corr.map(|c| self.string(py, c));
        let caus_o = caus.map(|c| self.string(py, c));
        let seq_o = seq.into_pyobject(py)?;

        let env = dict_for(py, 11)?;
        env.set_item(intern!(py, "message_id"), &eid_o)?;
        env.set_item(intern!(py, "type"), &etype_o)?;
        env.set_item(intern!(py, "aggregate_type"), &agg_type_o)?;
        env.set_item(intern!(py, "aggregate_id"), &agg_id_o)?;
        env.set_item(intern!(py, "payload"), &payload_obj)?;
        env.set_item(intern!(py, "occurred_at"), &at_str)?;
        let source = dict_for(py, 3)?;
        source.set_item(intern!(py, "type"), &stype_o)?;
        source.set_item(intern!(py, "id"), &sid_o)?;
        source.set_item(intern!(py, "seq"), &seq_o)?;
        env.set_item(intern!(py, "source"), source)?;
        if let Some(c) = &corr_o {
            env.set_item(intern!(py, "correlation_id"), c)?;
        }
        if let Some(c) = &caus_o {
            env.set_item(intern!(py, "causation_id"), c)?;
        }
        if !headers.is_empty() {
            let env_headers_o = PyDict::new(py);
            for (k, val) in &env_headers.0 {
                env_headers_o.set_item(*k, *val)?;
            }
            env.set_item(intern!(py, "headers"), &env_headers_o)?;
        }
        if let Some(n) = sv {
            if n != 1 {
                env.set_item(intern!(py, "schema_version"), n)?;
            }
        }
        if headers.is_empty() && !addressed {
            let h = PyDict::new(py);
            h.set_item(intern!(py, "aggbox-kind"), intern!(py, "event"))?;
            env.set_item(intern!(py, "headers"), h)?;
        }

        // the topic: the entry's, else the template's for (emitter, target, type)
        let topic_o: Bound<'py, PyAny> = match topic {
            Some(t) => PyString::new(py, t).into_any(),
            None => {
                self.keybuf.clear();
                self.keybuf.extend_from_slice(stype.as_bytes());
                self.keybuf.push(0);
                self.keybuf.extend_from_slice(agg_type.as_bytes());
                self.keybuf.push(0);
                self.keybuf.extend_from_slice(etype.as_bytes());
                match self.topics.get(self.keybuf.as_slice()) {
                    Some(t) => t.bind(py).clone().into_any(),
                    None => {
                        let kwargs = PyDict::new(py);
                        kwargs.set_item(intern!(py, "aggregate_type"), &stype_o)?;
                        kwargs.set_item(intern!(py, "target_type"), &agg_type_o)?;
                        kwargs.set_item(intern!(py, "type"), &etype_o)?;
                        kwargs.set_item(intern!(py, "collection"), self.collection.bind(py))?;
                        let t = sh.render_topic.bind(py).call(
                            (self.topic_template.bind(py),), Some(&kwargs))?;
                        let t = t.str()?;
                        if self.topics.len() >= CACHE_CAP {
                            self.topics.clear();
                        }
                        self.topics.insert(self.keybuf.clone(), t.clone().unbind());
                        t.into_any()
                    }
                }
            }
        };

        // the record's headers: the envelope's own first, then the ids (reference order)
        let rh = dict_for(py, 12 + headers.len() as isize)?;
        let kind_o = if addressed { intern!(py, "input") } else { intern!(py, "event") };
        if !headers.is_empty() {
            for (k, val) in &env_headers.0 {
                rh.set_item(*k, *val)?;
            }
            rh.set_item(intern!(py, "message_id"), &eid_o)?;
            rh.set_item(intern!(py, "type"), &etype_o)?;
            rh.set_item(intern!(py, "aggregate_type"), &agg_type_o)?;
            rh.set_item(intern!(py, "aggregate_id"), &agg_id_o)?;
            rh.set_item(intern!(py, "aggbox-kind"), kind_o)?;
        } else if addressed {
            rh.set_item(intern!(py, "message_id"), &eid_o)?;
            rh.set_item(intern!(py, "type"), &etype_o)?;
            rh.set_item(intern!(py, "aggregate_type"), &agg_type_o)?;
            rh.set_item(intern!(py, "aggregate_id"), &agg_id_o)?;
            rh.set_item(intern!(py, "aggbox-kind"), kind_o)?;
        } else {
            rh.set_item(intern!(py, "aggbox-kind"), kind_o)?;
            rh.set_item(intern!(py, "message_id"), &eid_o)?;
            rh.set_item(intern!(py, "type"), &etype_o)?;
            rh.set_item(intern!(py, "aggregate_type"), &agg_type_o)?;
            rh.set_item(intern!(py, "aggregate_id"), &agg_id_o)?;
        }
        if let Some(c) = &caus_o {
            rh.set_item(intern!(py, "causation_id"), c)?;
        }
        if let Some(c) = &corr_o {
            rh.set_item(intern!(py, "correlation_id"), c)?;
        }
        rh.set_item(intern!(py, "source_type"), &stype_o)?;
        rh.set_item(intern!(py, "source_id"), &sid_o)?;
        let mut seq_text = Vec::with_capacity(12);
        push_i64(&mut seq_text, seq as i64);
        rh.set_item(intern!(py, "source_seq"), std::str::from_utf8(&seq_text).unwrap())?;

        let key_o: Bound<'py, PyAny> = match key {
            Some(k) if k == sid => sid_o.clone().into_any(),
            Some(k) => PyString::new(py, k).into_any(),
            None => sid_o.clone().into_any(),
        };
        let entry_o = Bound::new(py, BsonEntry { raw: entry.clone().unbind(),
                                                 doc: OnceLock::new() })?;
        let values: [Bound<'py, PyAny>; 11] = [
            eid_o.into_any(), self.collection.bind(py).clone().into_any(), document_id,
            stype_o.into_any(), topic_o, key_o, PyBytes::new(py, &v).into_any(), rh.into_any(),
            env.into_any(), created, entry_o.into_any(),
        ];
        let record = new_record(py, sh, values)?;
        Ok(Some(record))
    }
}

/// `OutboundRecord` with its slots filled directly (as `aggregates.core.fastbuild.
/// slot_builder`: the object its `__init__` builds, without `object.__setattr__`).
fn new_record<'py>(py: Python<'py>, sh: &Shared, values: [Bound<'py, PyAny>; 11])
                   -> PyResult<Bound<'py, PyAny>> {
    let cls = sh.record_type.bind(py);
    let obj = unsafe {
        let t = cls.as_ptr() as *mut ffi::PyTypeObject;
        let alloc = (*t).tp_alloc.ok_or_else(|| PyRuntimeError::new_err("no tp_alloc"))?;
        let o = alloc(t, 0);
        if o.is_null() {
            return Err(PyErr::fetch(py));
        }
        Bound::from_owned_ptr(py, o)
    };
    if let Some(offsets) = &sh.offsets {
        // a new object: its slots are empty (NULL); a member descriptor would store the
        // same reference there
        for (off, value) in offsets.iter().zip(values) {
            unsafe {
                let slot = (obj.as_ptr() as *mut u8).offset(*off) as *mut *mut ffi::PyObject;
                *slot = value.into_ptr();
            }
        }
        return Ok(obj);
    }
    for (setter, value) in sh.setters.iter().zip(values.iter()) {
        unsafe {
            let d = setter.as_ptr();
            let set = (*ffi::Py_TYPE(d)).tp_descr_set
                .ok_or_else(|| PyRuntimeError::new_err("not a slot"))?;
            if set(d, obj.as_ptr(), value.as_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
        }
    }
    Ok(obj)
}

// ---------------------------------------------------------------- documents

/// A document read as raw BSON: `({"_id", "_type"?, "_p"?}, [(entry id or None, entry
/// bytes or None), ...])` — the entries of its outbox in order (a non-document element is
/// `(None, None)`, an entry without a string id `(None, bytes)`); `None` when the document
/// is not of the usual shape (its `_id` not a string, `_p` not an int32, `outbox` not an
/// array …: decode it in Python).
#[pyfunction]
fn outbox_of<'py>(py: Python<'py>, doc: &[u8]) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let Ok(mut it) = elems(doc) else { return Ok(None) };
    let view = PyDict::new(py);
    let entries = PyList::empty(py);
    let (mut seen_id, mut seen_type, mut seen_p, mut seen_outbox) = (false, false, false, false);
    loop {
        let Ok(next) = it.next() else { return Ok(None) };
        let Some((k, v)) = next else { break };
        match k {
            b"_id" => {
                let Some(s) = (if let V::Str(b) = v { utf8(b) } else { None }) else {
                    return Ok(None);
                };
                if seen_id {
                    return Ok(None);
                }
                seen_id = true;
                view.set_item(intern!(py, "_id"), s)?;
            }
            b"_type" => {
                if seen_type {
                    return Ok(None);
                }
                seen_type = true;
                match v {
                    V::Str(b) => match utf8(b) {
                        Some(s) => view.set_item(intern!(py, "_type"), s)?,
                        None => return Ok(None),
                    },
                    V::Null => view.set_item(intern!(py, "_type"), py.None())?,
                    _ => return Ok(None),
                }
            }
            b"_p" => {
                let V::Int32(p) = v else { return Ok(None) };
                if seen_p {
                    return Ok(None);
                }
                seen_p = true;
                view.set_item(intern!(py, "_p"), p)?;
            }
            b"outbox" => {
                if seen_outbox {
                    return Ok(None);
                }
                seen_outbox = true;
                match v {
                    V::Arr(a) => {
                        let Ok(mut items) = elems(a) else { return Ok(None) };
                        loop {
                            let Ok(next) = items.next() else { return Ok(None) };
                            let Some((_, e)) = next else { break };
                            let pair = match e {
                                V::Doc(d) => {
                                    let id = match elems(d).ok().and_then(|mut ei| {
                                        let mut found = None;
                                        loop {
                                            match ei.next() {
                                                Ok(Some((b"id", V::Str(s)))) => found = Some(Some(s)),
                                                Ok(Some((b"id", _))) => found = Some(None),
                                                Ok(Some(_)) => {}
                                                Ok(None) => return Some(found.flatten()),
                                                Err(()) => return None,
                                            }
                                        }
                                    }) {
                                        Some(Some(b)) if !b.is_empty() => match utf8(b) {
                                            Some(s) => PyString::new(py, s).into_any(),
                                            None => return Ok(None),
                                        },
                                        Some(_) => py.None().into_bound(py),
                                        None => return Ok(None),
                                    };
                                    PyTuple::new(py, [id, PyBytes::new(py, d).into_any()])?
                                }
                                _ => PyTuple::new(py, [py.None().into_bound(py), py.None().into_bound(py)])?,
                            };
                            entries.append(pair)?;
                        }
                    }
                    V::Null => {}
                    _ => return Ok(None),
                }
            }
            _ => {}
        }
    }
    if !seen_id {
        return Ok(None);
    }
    Ok(Some(PyTuple::new(py, [view.into_any(), entries.into_any()])?))
}

// ---------------------------------------------------------------- the stored entry

/// A record's stored entry: a read-only mapping of its BSON, decoded (``bson.decode``, tz
/// aware) on first use.
#[pyclass(module = "_aggbox_native", frozen)]
struct BsonEntry {
    raw: Py<PyBytes>,
    doc: OnceLock<Py<PyAny>>,
}

impl BsonEntry {
    fn decoded<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(d) = self.doc.get() {
            return Ok(d.bind(py).clone());
        }
        let d = shared()?.decode.bind(py).call1((self.raw.bind(py),))?;
        let _ = self.doc.set(d.clone().unbind());
        Ok(d)
    }
}

#[pymethods]
impl BsonEntry {
    #[getter]
    fn raw<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.raw.bind(py).clone()
    }

    fn __getitem__<'py>(&self, py: Python<'py>, key: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.decoded(py)?.get_item(key)
    }

    #[pyo3(signature = (key, default=None))]
    fn get<'py>(&self, py: Python<'py>, key: Bound<'py, PyAny>, default: Option<Bound<'py, PyAny>>)
                -> PyResult<Bound<'py, PyAny>> {
        let d = self.decoded(py)?;
        let default = default.unwrap_or_else(|| py.None().into_bound(py));
        d.call_method1("get", (key, default))
    }

    fn __contains__<'py>(&self, py: Python<'py>, key: Bound<'py, PyAny>) -> PyResult<bool> {
        self.decoded(py)?.contains(key)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.decoded(py)?.len()
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.decoded(py)?.try_iter()?.into_any())
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.decoded(py)?.call_method0("keys")
    }

    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.decoded(py)?.call_method0("items")
    }

    fn values<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.decoded(py)?.call_method0("values")
    }

    fn __eq__<'py>(&self, py: Python<'py>, other: Bound<'py, PyAny>) -> PyResult<bool> {
        let other = match other.cast::<BsonEntry>() {
            Ok(e) => e.get().decoded(py)?,
            Err(_) => other,
        };
        self.decoded(py)?.eq(other)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("BsonEntry({})", self.decoded(py)?.repr()?))
    }
}

/// Adds the record builder's classes and functions to the module (lib.rs calls it).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RecordMaker>()?;
    m.add_class::<BsonEntry>()?;
    m.add_function(wrap_pyfunction!(records_init, m)?)?;
    m.add_function(wrap_pyfunction!(outbox_of, m)?)?;
    Ok(())
}

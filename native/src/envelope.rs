//! The executor's parse of one Arrow batch (docs/design.md "The hot path"): the `_raw`
//! column's JSON lines, read straight from the Arrow buffers, proven to be the common valid
//! envelope and built as `Message` objects — exactly what
//! `aggregates.message.fastbatch.fast_messages` (the Python definition) builds for them.
//!
//! Contract: a row is either proven (its `Message`, with the same field values and types,
//! payload key order and values as `Message.from_dict(json.loads(line))`), or left to
//! Python with its text (`str`) — this side never decides a failure. Proven are lines that
//! are one JSON object from the first byte to the last, valid UTF-8, with the five
//! required fields (ids: non-empty strings of at most 512 characters, no white space
//! around them, no NUL), a payload object of JSON values (keys without a leading `$`, a
//! dot or NUL; integers within int64; finite floats; at most 60 levels deep), and
//! optionally `occurred_at` (null or `YYYY-MM-DDTHH:MM:SS[.fff[fff]]Z`, cut to
//! milliseconds), `source` (exactly `type`, `id`, `seq`), `correlation_id`,
//! `causation_id`, `headers` (string → string, keys without a leading `$` or NUL) and
//! `schema_version` (1 ..= 2^31-1). No string may hold a lone surrogate. Anything else —
//! unknown fields, NaN or Infinity, other time forms, a wrong type even where a duplicate
//! key would later replace it — is left to Python.
//!
//! Duplicate keys: the last value wins at the first key's position (`PyDict_SetItem`), as
//! Python's `json` builds dicts. Numbers: integers as `int` (refused beyond int64, as the
//! Python path refuses them), floats correctly rounded (Rust's `f64::from_str`, as
//! CPython's `float()`).

use std::ptr::addr_of_mut;
use std::sync::OnceLock;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

/// Deepest container under the payload (the payload is level 0), as `plain_payload`.
const MAX_WALK_DEPTH: u32 = 60;
const MAX_ID_LENGTH: usize = 512;
/// The string memo: 2^MEMO_BITS entries of ASCII strings up to MEMO_MAX_LEN bytes.
const MEMO_BITS: u32 = 8;
const MEMO_MAX_LEN: usize = 24;
const MAX_SCHEMA_VERSION: i64 = (1 << 31) - 1;
/// Longest line proven when no payload limit bounds it (`fastbatch._MAX_FAST_CHARS`).
const MAX_FAST_CHARS: usize = 1 << 20;
/// BSON bytes per JSON character at most (`fastpath._BSON_PER_CHAR`).
const BSON_PER_CHAR: usize = 16;
/// `PyMemberDef.type` of a slot (`T_OBJECT_EX`), and its read-only flag.
const T_OBJECT_EX: i32 = 16;
const READONLY: i32 = 1;

/// The envelope's fields, in `Message`'s slot order.
const FIELDS: [&[u8]; 11] = [
    b"message_id",
    b"type",
    b"aggregate_type",
    b"aggregate_id",
    b"payload",
    b"occurred_at",
    b"source",
    b"correlation_id",
    b"causation_id",
    b"headers",
    b"schema_version",
];
const F_PAYLOAD: usize = 4;
const F_OCCURRED_AT: usize = 5;
const F_SOURCE: usize = 6;
const F_HEADERS: usize = 9;
const F_VERSION: usize = 10;

struct Types {
    message: *mut ffi::PyTypeObject,
    message_offsets: [isize; 11],
    source: *mut ffi::PyTypeObject,
    source_offsets: [isize; 3],
    /// The int 1 (the default `schema_version`), a reference held for good.
    one: *mut ffi::PyObject,
    /// Keeps the two classes alive.
    _keep: (Py<PyAny>, Py<PyAny>),
}

// SAFETY: the pointers are to the two classes, kept alive by `_keep`; used with the GIL held.
unsafe impl Send for Types {}
unsafe impl Sync for Types {}

static TYPES: OnceLock<Types> = OnceLock::new();

// ---------------------------------------------------------------- owned references

/// A strong reference, released on drop (so a refused line leaks nothing).
struct Obj(*mut ffi::PyObject);

impl Obj {
    /// Takes a new reference; None (and the Python error cleared) when it is NULL.
    fn new(p: *mut ffi::PyObject) -> Option<Obj> {
        if p.is_null() {
            // SAFETY: the GIL is held by every caller (they run inside a #[pyfunction]).
            unsafe { ffi::PyErr_Clear() };
            None
        } else {
            Some(Obj(p))
        }
    }

    fn none() -> Obj {
        // SAFETY: the GIL is held; None is immortal or counted.
        unsafe { Obj(ffi::Py_NewRef(ffi::Py_None())) }
    }

    fn into_raw(self) -> *mut ffi::PyObject {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl Drop for Obj {
    fn drop(&mut self) {
        // SAFETY: a strong reference we own; the GIL is held.
        unsafe { ffi::Py_XDECREF(self.0) }
    }
}

/// A buffer of a Python object (the buffer protocol, any format), released on drop.
struct Buf {
    view: ffi::Py_buffer,
}

impl Buf {
    fn get(o: &Bound<'_, PyAny>) -> PyResult<Buf> {
        let mut view: ffi::Py_buffer = unsafe { std::mem::zeroed() };
        // SAFETY: `o` is alive, the GIL is held; PyBUF_SIMPLE: contiguous bytes.
        if unsafe { ffi::PyObject_GetBuffer(o.as_ptr(), &mut view, ffi::PyBUF_SIMPLE) } != 0 {
            return Err(PyErr::fetch(o.py()));
        }
        Ok(Buf { view })
    }

    fn bytes(&self) -> &[u8] {
        if self.view.buf.is_null() || self.view.len <= 0 {
            return &[];
        }
        // SAFETY: the exporter keeps `len` bytes at `buf` until the buffer is released.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.view.len as usize) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: obtained by PyObject_GetBuffer; the GIL is held.
        unsafe { ffi::PyBuffer_Release(&mut self.view) }
    }
}

// ---------------------------------------------------------------- Python objects

/// A `str` of valid UTF-8 bytes (`ascii`: all below 0x80).
#[inline(always)]
unsafe fn new_str(s: &[u8], ascii: bool) -> Option<Obj> {
    if ascii {
        let o = Obj::new(ffi::PyUnicode_New(s.len() as ffi::Py_ssize_t, 127))?;
        std::ptr::copy_nonoverlapping(s.as_ptr(), ffi::PyUnicode_DATA(o.0) as *mut u8, s.len());
        Some(o)
    } else {
        Obj::new(ffi::PyUnicode_FromStringAndSize(s.as_ptr() as *const _, s.len() as ffi::Py_ssize_t))
    }
}

/// An instance of a slotted class, its slots filled (references taken), no `__init__` run:
/// what `object.__new__(cls)` and one slot store per field give.
unsafe fn new_slotted<const N: usize>(
    t: *mut ffi::PyTypeObject,
    offsets: &[isize; N],
    values: [Obj; N],
) -> Option<Obj> {
    let alloc = (*t).tp_alloc?;
    let o = Obj::new(alloc(t, 0))?;
    let base = o.0 as *mut u8;
    for (off, v) in offsets.iter().zip(values) {
        *(base.offset(*off) as *mut *mut ffi::PyObject) = v.into_raw();
    }
    Some(o)
}

// ---------------------------------------------------------------- the parser

/// A string token: its bytes between the quotes, whether it has escapes, whether ASCII.
#[derive(Clone, Copy)]
struct Tok {
    start: usize,
    end: usize,
    escaped: bool,
    ascii: bool,
}

/// The envelope field a key names (its slot): by length, then by words.
#[inline(always)]
fn field_of(key: &[u8]) -> Option<usize> {
    const fn short(s: &[u8]) -> [u64; 3] {
        // words3 of a 4..=7-byte constant
        let n = s.len();
        let mut a = 0u64;
        let mut b = 0u64;
        let mut j = 0;
        while j < 4 {
            a |= (s[j] as u64) << (8 * j);
            b |= (s[n - 4 + j] as u64) << (8 * j);
            j += 1;
        }
        [a | b << 32, 0, 0]
    }
    const TYPE: [u64; 3] = short(b"type");
    const SOURCE: [u64; 3] = short(b"source");
    const PAYLOAD: [u64; 3] = short(b"payload");
    const HEADERS: [u64; 3] = short(b"headers");
    const MESSAGE_ID: [u64; 3] = const_words3(b"message_id");
    const OCCURRED_AT: [u64; 3] = const_words3(b"occurred_at");
    const AGGREGATE_ID: [u64; 3] = const_words3(b"aggregate_id");
    const CAUSATION_ID: [u64; 3] = const_words3(b"causation_id");
    const AGGREGATE_TYPE: [u64; 3] = const_words3(b"aggregate_type");
    const CORRELATION_ID: [u64; 3] = const_words3(b"correlation_id");
    const SCHEMA_VERSION: [u64; 3] = const_words3(b"schema_version");
    let w = words3(key);
    let slot = match key.len() {
        4 if w == TYPE => 1,
        6 if w == SOURCE => F_SOURCE,
        7 if w == PAYLOAD => F_PAYLOAD,
        7 if w == HEADERS => F_HEADERS,
        10 if w == MESSAGE_ID => 0,
        11 if w == OCCURRED_AT => F_OCCURRED_AT,
        12 if w == AGGREGATE_ID => 3,
        12 if w == CAUSATION_ID => 8,
        14 if w == AGGREGATE_TYPE => 2,
        14 if w == CORRELATION_ID => 7,
        14 if w == SCHEMA_VERSION => F_VERSION,
        _ => return None,
    };
    Some(slot)
}

/// Why a string is checked: payload keys, ids and header keys have rules of their own.
#[derive(Clone, Copy, PartialEq)]
enum Rule {
    Any,
    PayloadKey,
    Id,
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    scratch: Vec<u8>,
    /// The last `occurred_at` text and its datetime (lines of a batch often share it).
    /// The last `occurred_at` text (its length and `words3` of its first 24 bytes — with
    /// the last three compared too) and its datetime (lines of a batch often share it).
    last_at: (usize, [u64; 3], [u8; 3]),
    last_dt: Option<Obj>,
    at_tail: [u8; 7],
    /// A string of the line was not ASCII (its UTF-8 is then checked).
    nonascii: bool,
    /// Recent short ASCII strings of the batch (payload keys, names) and their `str`.
    memo: Vec<MemoEntry>,
}

/// A memo entry: a string's bytes (zero-padded words), length and `str` (or NULL).
struct MemoEntry {
    words: [u64; 3],
    len: usize,
    obj: Obj,
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` that may be a quote, a backslash, a control character
/// or non-ASCII; the lowest one set is always such a byte (the others may be false).
#[inline(always)]
fn special_bytes(w: u64) -> u64 {
    let zero = |x: u64| x.wrapping_sub(ONES) & !x;
    let quote = zero(w ^ (ONES * b'"' as u64));
    let backslash = zero(w ^ (ONES * b'\\' as u64));
    let control = w.wrapping_sub(ONES * 0x20) & !w;
    (quote | backslash | control | w) & HIGH
}

/// `s` (1 to 24 bytes) as three words that, with its length, tell it from any other such
/// string: overlapping unaligned loads, no copy.
#[inline(always)]
fn words3(s: &[u8]) -> [u64; 3] {
    let n = s.len();
    let load8 = |i: usize| u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    let load4 = |i: usize| u32::from_le_bytes(s[i..i + 4].try_into().expect("4 bytes")) as u64;
    if n >= 16 {
        [load8(0), load8(8), load8(n - 8)]
    } else if n >= 8 {
        [load8(0), load8(n - 8), 0]
    } else if n >= 4 {
        [load4(0) | load4(n - 4) << 32, 0, 0]
    } else if n > 0 {
        [s[0] as u64 | (s[n / 2] as u64) << 8 | (s[n - 1] as u64) << 16, 0, 0]
    } else {
        [0, 0, 0]
    }
}

/// `words3` of a constant (for the field names).
const fn const_words3(s: &[u8]) -> [u64; 3] {
    let n = s.len();
    let mut out = [0u64; 3];
    let mut k = 0;
    let starts: [usize; 3] = if n >= 16 { [0, 8, n - 8] } else { [0, n - 8, usize::MAX] };
    while k < 3 {
        if starts[k] != usize::MAX {
            let mut w = 0u64;
            let mut j = 0;
            while j < 8 {
                w |= (s[starts[k] + j] as u64) << (8 * j);
                j += 1;
            }
            out[k] = w;
        }
        k += 1;
    }
    out
}

/// `s` holds the byte `b` (eight bytes at a time).
#[inline(always)]
fn has_byte(s: &[u8], b: u8) -> bool {
    let pattern = ONES * b as u64;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let x = u64::from_le_bytes(c.try_into().expect("8 bytes")) ^ pattern;
        if x.wrapping_sub(ONES) & !x & HIGH != 0 {
            return true;
        }
    }
    chunks.remainder().contains(&b)
}

#[inline(always)]
fn is_ws(b: u8) -> bool {
    b == b' ' || b == b'\t' || b == b'\n' || b == b'\r'
}

fn hex4(s: &[u8]) -> Option<u32> {
    if s.len() < 4 {
        return None;
    }
    let mut v = 0u32;
    for &b in &s[..4] {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = v << 4 | d as u32;
    }
    Some(v)
}

/// Python's `str.isspace` (what `str.strip()` removes) for one code point.
fn py_space(c: u32) -> bool {
    matches!(c, 0x09..=0x0d | 0x1c..=0x20 | 0x85 | 0xa0 | 0x1680 | 0x2000..=0x200a
        | 0x2028 | 0x2029 | 0x202f | 0x205f | 0x3000)
}

fn first_char(s: &[u8]) -> u32 {
    std::str::from_utf8(s).ok().and_then(|t| t.chars().next()).map_or(0, |c| c as u32)
}

fn last_char(s: &[u8]) -> u32 {
    std::str::from_utf8(s).ok().and_then(|t| t.chars().next_back()).map_or(0, |c| c as u32)
}

/// An id or name `from_dict` keeps as it is (`fastpath.id_ok`): UTF-8 without a lone
/// surrogate is given; `escaped`: the token had escapes.
fn id_ok(s: &[u8], ascii: bool, escaped: bool) -> bool {
    // NUL can only come from an escape (the token refuses raw control characters).
    if s.is_empty() || (escaped && s.contains(&0)) {
        return false;
    }
    let n = if ascii { s.len() } else { s.iter().filter(|&&b| b & 0xc0 != 0x80).count() };
    if n > MAX_ID_LENGTH {
        return false;
    }
    let (a, z) = (s[0], s[s.len() - 1]);
    let first = if a < 0x80 { a as u32 } else { first_char(s) };
    let last = if z < 0x80 { z as u32 } else { last_char(s) };
    !py_space(first) && !py_space(last)
}

/// The token's decoded UTF-8 (escapes undone into `scratch`) and whether it is ASCII;
/// None for an invalid escape or a lone surrogate.
#[inline(always)]
fn text<'b>(line: &'b [u8], scratch: &'b mut Vec<u8>, t: Tok) -> Option<(&'b [u8], bool)> {
    if !t.escaped {
        return Some((&line[t.start..t.end], t.ascii));
    }
    unescape(line, scratch, t)
}

/// An escaped string token decoded into `scratch`.
#[inline(never)]
fn unescape<'b>(line: &'b [u8], scratch: &'b mut Vec<u8>, t: Tok) -> Option<(&'b [u8], bool)> {
    let s = &line[t.start..t.end];
    let out = &mut *scratch;
    out.clear();
    let mut ascii = t.ascii;
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let e = *s.get(i + 1)?;
        i += 2;
        let c = match e {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 8,
            b'f' => 12,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let mut c = hex4(&s[i..])?;
                i += 4;
                if (0xdc00..0xe000).contains(&c) {
                    return None; // a lone low surrogate
                }
                if (0xd800..0xdc00).contains(&c) {
                    // a pair, or a lone high surrogate
                    if s.get(i) != Some(&b'\\') || s.get(i + 1) != Some(&b'u') {
                        return None;
                    }
                    let lo = hex4(&s[i + 2..])?;
                    if !(0xdc00..0xe000).contains(&lo) {
                        return None;
                    }
                    i += 6;
                    c = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
                }
                if c >= 0x80 {
                    ascii = false;
                }
                let ch = char::from_u32(c)?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                continue;
            }
            _ => return None,
        };
        out.push(c);
    }
    Some((&scratch[..], ascii))
}


impl<'a> Parser<'a> {
    #[inline(always)]
    fn ws(&mut self) {
        while self.i < self.s.len() && is_ws(self.s[self.i]) {
            self.i += 1;
        }
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    #[inline(always)]
    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// The string at `self.i` (its opening quote): its span, no control character in it.
    #[inline(always)]
    fn token(&mut self) -> Option<Tok> {
        if !self.eat(b'"') {
            return None;
        }
        let s = self.s;
        let n = s.len();
        let start = self.i;
        let mut i = start;
        let (mut escaped, mut ascii) = (false, true);
        loop {
            // Eight bytes at a time: the first quote, backslash, control or non-ASCII byte.
            while i + 8 <= n {
                let w = u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"));
                let m = special_bytes(w);
                if m != 0 {
                    i += (m.trailing_zeros() / 8) as usize;
                    break;
                }
                i += 8;
            }
            let b = *s.get(i)?;
            match b {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                0..=0x1f => return None, // json's strict decoder refuses control characters
                0x80..=0xff => {
                    ascii = false;
                    self.nonascii = true;
                    i += 1;
                }
                _ => i += 1,
            }
        }
        self.i = i + 1;
        Some(Tok { start, end: i, escaped, ascii })
    }

    /// The string at `self.i` as a `str`, checked by `rule`; `memo`: a short ASCII one is
    /// shared with an equal one of the batch (`json` shares a document's equal keys).
    unsafe fn string(&mut self, rule: Rule, memo: bool) -> Option<Obj> {
        let t = self.token()?;
        let (s, ascii) = text(self.s, &mut self.scratch, t)?;
        let ok = match rule {
            Rule::Any => true,
            Rule::PayloadKey => {
                s.first() != Some(&b'$') && !has_byte(s, b'.') && !(t.escaped && s.contains(&0))
            }
            Rule::Id => id_ok(s, ascii, t.escaped),
        };
        if !ok {
            return None;
        }
        if !(memo && ascii && s.len() <= MEMO_MAX_LEN) {
            return new_str(s, ascii);
        }
        let words = words3(s);
        let h = (words[0] ^ words[1].rotate_left(21) ^ words[2].rotate_left(42) ^ s.len() as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let entry = &mut self.memo[(h >> (64 - MEMO_BITS)) as usize];
        if entry.len == s.len() && entry.words == words && !entry.obj.0.is_null() {
            return Some(Obj(ffi::Py_NewRef(entry.obj.0)));
        }
        let o = new_str(s, true)?;
        entry.words = words;
        entry.len = s.len();
        entry.obj = Obj(ffi::Py_NewRef(o.0));
        Some(o)
    }

    /// A JSON number at `self.i`: an int within int64, or a finite float.
    unsafe fn number(&mut self) -> Option<Obj> {
        let s = self.s;
        let start = self.i;
        let mut i = start;
        if s.get(i) == Some(&b'-') {
            i += 1;
        }
        match s.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while matches!(s.get(i), Some(b'0'..=b'9')) {
                    i += 1;
                }
            }
            _ => return None, // "-Infinity", or no number
        }
        let mut float = false;
        if s.get(i) == Some(&b'.') {
            i += 1;
            if !matches!(s.get(i), Some(b'0'..=b'9')) {
                return None;
            }
            while matches!(s.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
            float = true;
        }
        if matches!(s.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(s.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !matches!(s.get(i), Some(b'0'..=b'9')) {
                return None;
            }
            while matches!(s.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
            float = true;
        }
        self.i = i;
        let text = &s[start..i];
        if float {
            // SAFETY: ASCII digits, sign, dot and exponent only.
            let x: f64 = std::str::from_utf8_unchecked(text).parse().ok()?;
            if !x.is_finite() {
                return None; // 1e400: Python reads inf, which is no JSON value
            }
            return Obj::new(ffi::PyFloat_FromDouble(x));
        }
        let (neg, digits) = if text[0] == b'-' { (true, &text[1..]) } else { (false, text) };
        let v: i64 = if digits.len() <= 18 {
            let u = digits.iter().fold(0i64, |v, &d| v * 10 + (d - b'0') as i64);
            if neg { -u } else { u }
        } else {
            if digits.len() > 19 {
                return None;
            }
            let u = digits.iter().fold(0i128, |v, &d| v * 10 + (d - b'0') as i128);
            let v = if neg { -u } else { u };
            if v < i64::MIN as i128 || v > i64::MAX as i128 {
                return None;
            }
            v as i64
        };
        Obj::new(ffi::PyLong_FromLongLong(v))
    }

    #[inline(always)]
    fn literal(&mut self, word: &[u8]) -> bool {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    /// A payload value: JSON, with the payload's rules; `depth` is the level of a container
    /// starting here.
    unsafe fn value(&mut self, depth: u32) -> Option<Obj> {
        match self.peek()? {
            b'"' => self.string(Rule::Any, false),
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b't' if self.literal(b"true") => Some(Obj(ffi::Py_NewRef(ffi::Py_True()))),
            b'f' if self.literal(b"false") => Some(Obj(ffi::Py_NewRef(ffi::Py_False()))),
            b'n' if self.literal(b"null") => Some(Obj::none()),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// A payload object at `self.i`: a dict built as `json` builds it.
    unsafe fn object(&mut self, depth: u32) -> Option<Obj> {
        if depth > MAX_WALK_DEPTH || !self.eat(b'{') {
            return None;
        }
        let d = Obj::new(ffi::PyDict_New())?;
        self.ws();
        if self.eat(b'}') {
            return Some(d);
        }
        loop {
            let k = self.string(Rule::PayloadKey, true)?;
            self.ws();
            if !self.eat(b':') {
                return None;
            }
            self.ws();
            let v = self.value(depth + 1)?;
            if ffi::PyDict_SetItem(d.0, k.0, v.0) != 0 {
                ffi::PyErr_Clear();
                return None;
            }
            self.ws();
            if self.eat(b',') {
                self.ws();
                continue;
            }
            return if self.eat(b'}') { Some(d) } else { None };
        }
    }

    unsafe fn array(&mut self, depth: u32) -> Option<Obj> {
        if depth > MAX_WALK_DEPTH || !self.eat(b'[') {
            return None;
        }
        let mut items: Vec<Obj> = Vec::new();
        self.ws();
        if !self.eat(b']') {
            loop {
                items.push(self.value(depth + 1)?);
                self.ws();
                if self.eat(b',') {
                    self.ws();
                    continue;
                }
                if self.eat(b']') {
                    break;
                }
                return None;
            }
        }
        let l = Obj::new(ffi::PyList_New(items.len() as ffi::Py_ssize_t))?;
        for (i, v) in items.into_iter().enumerate() {
            ffi::PyList_SET_ITEM(l.0, i as ffi::Py_ssize_t, v.into_raw());
        }
        Some(l)
    }

    /// `{ "k": value, ... }` at envelope level: `f` gets each key's decoded bytes and reads
    /// the value (false: refused).
    unsafe fn fields(&mut self, mut f: impl FnMut(&mut Self, &[u8]) -> bool) -> bool {
        if !self.eat(b'{') {
            return false;
        }
        self.ws();
        if self.eat(b'}') {
            return true;
        }
        let s: &'a [u8] = self.s;
        let mut escaped_key: Vec<u8> = Vec::new();
        loop {
            let Some(t) = self.token() else { return false };
            let key: &[u8] = if t.escaped {
                let Some((k, _)) = text(s, &mut self.scratch, t) else { return false };
                escaped_key.clear();
                escaped_key.extend_from_slice(k);
                &escaped_key
            } else {
                &s[t.start..t.end]
            };
            self.ws();
            if !self.eat(b':') {
                return false;
            }
            self.ws();
            if !f(self, key) {
                return false;
            }
            self.ws();
            if self.eat(b',') {
                self.ws();
                continue;
            }
            return self.eat(b'}');
        }
    }

    /// `occurred_at`: null, or `YYYY-MM-DDTHH:MM:SS[.fff[fff]]Z` as an aware UTC datetime cut
    /// to milliseconds (`datetime.fromisoformat`'s value; an impossible date: refused).
    unsafe fn occurred_at(&mut self) -> Option<Obj> {
        if self.peek()? == b'n' {
            return if self.literal(b"null") { Some(Obj::none()) } else { None };
        }
        let t = self.token()?;
        if t.escaped {
            return None;
        }
        let s = &self.s[t.start..t.end];
        let n = s.len();
        if !(n == 20 || n == 24 || n == 27) || s[n - 1] != b'Z' {
            return None;
        }
        let key = (n, words3(&s[..20]), [s[n - 3], s[n - 2], s[n - 1]]);
        if let Some(dt) = &self.last_dt {
            if key == self.last_at && (n < 24 || s[20..24] == self.at_tail[..4]) {
                return Some(Obj(ffi::Py_NewRef(dt.0)));
            }
        }
        let t: &[u8; 20] = s[..20].try_into().expect("20 bytes");
        let d2 = |i: usize| {
            let (a, b) = (t[i].wrapping_sub(b'0'), t[i + 1].wrapping_sub(b'0'));
            if a > 9 || b > 9 { None } else { Some((a * 10 + b) as i32) }
        };
        if t[4] != b'-' || t[7] != b'-' || t[10] != b'T' || t[13] != b':' || t[16] != b':' {
            return None;
        }
        let year = d2(0)? * 100 + d2(2)?;
        let (month, day, hour, minute, second) = (d2(5)?, d2(8)?, d2(11)?, d2(14)?, d2(17)?);
        let mut ms = 0;
        if n > 20 {
            if s[19] != b'.' || !s[20..n - 1].iter().all(u8::is_ascii_digit) {
                return None;
            }
            ms = s[20..23].iter().fold(0i32, |v, &d| v * 10 + (d - b'0') as i32);
        }
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        let days = match month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return None,
        };
        if year < 1 || day < 1 || day > days || hour > 23 || minute > 59 || second > 59 {
            return None;
        }
        let api = ffi::PyDateTimeAPI();
        let dt = Obj::new(((*api).DateTime_FromDateAndTime)(
            year, month, day, hour, minute, second, ms * 1000, (*api).TimeZone_UTC,
            (*api).DateTimeType,
        ))?;
        self.last_at = key;
        self.at_tail[..n - 20].copy_from_slice(&s[20..]);
        self.last_dt = Some(Obj(ffi::Py_NewRef(dt.0)));
        Some(dt)
    }

    /// A JSON int at `self.i` in `lo..=hi` (a float, bool or anything else: None).
    unsafe fn int_in(&mut self, lo: i64, hi: i64) -> Option<Obj> {
        let o = self.number()?;
        if ffi::Py_TYPE(o.0) != addr_of_mut!(ffi::PyLong_Type) {
            return None;
        }
        let v = ffi::PyLong_AsLongLong(o.0);
        if v < lo || v > hi {
            return None;
        }
        Some(o)
    }

    unsafe fn source(&mut self, types: &Types) -> Option<Obj> {
        if self.peek()? == b'n' {
            return if self.literal(b"null") { Some(Obj::none()) } else { None };
        }
        let mut parts: [Option<Obj>; 3] = [None, None, None];
        let ok = self.fields(|p, key| {
            let (slot, v) = match key {
                b"type" => (0, p.string(Rule::Id, true)),
                b"id" => (1, p.string(Rule::Id, true)),
                b"seq" => (2, p.int_in(1, i64::MAX)),
                _ => return false, // extra keys: Python's path decides
            };
            parts[slot] = v;
            parts[slot].is_some()
        });
        if !ok {
            return None;
        }
        let [Some(t), Some(i), Some(s)] = parts else { return None };
        new_slotted(types.source, &types.source_offsets, [t, i, s])
    }

    unsafe fn headers(&mut self) -> Option<Obj> {
        if self.peek()? == b'n' {
            return if self.literal(b"null") { Obj::new(ffi::PyDict_New()) } else { None };
        }
        let d = Obj::new(ffi::PyDict_New())?;
        let ok = self.fields(|p, key| {
            if key.first() == Some(&b'$') || key.contains(&0) {
                return false;
            }
            let ascii = key.is_ascii();
            // SAFETY (all below): the GIL is held.
            let (Some(k), Some(v)) = (new_str(key, ascii), p.string(Rule::Any, false)) else {
                return false;
            };
            if ffi::PyDict_SetItem(d.0, k.0, v.0) != 0 {
                ffi::PyErr_Clear();
                return false;
            }
            true
        });
        if ok { Some(d) } else { None }
    }

    /// An optional id: null or an id.
    unsafe fn opt_id(&mut self) -> Option<Obj> {
        if self.peek()? == b'n' {
            return if self.literal(b"null") { Some(Obj::none()) } else { None };
        }
        self.string(Rule::Id, false)
    }

    /// The whole line as a Message, or None.
    unsafe fn message(&mut self, types: &Types) -> Option<Obj> {
        let mut f: [Option<Obj>; 11] = Default::default();
        let ok = self.fields(|p, key| {
            let Some(slot) = field_of(key) else { return false };
            let v = match slot {
                0 => p.string(Rule::Id, false),
                1..=3 => p.string(Rule::Id, true),
                F_PAYLOAD => {
                    if p.peek() == Some(b'{') { p.object(0) } else { None }
                }
                F_OCCURRED_AT => p.occurred_at(),
                F_SOURCE => p.source(types),
                7 | 8 => p.opt_id(),
                F_HEADERS => p.headers(),
                _ => {
                    if p.peek() == Some(b'n') {
                        if p.literal(b"null") { Some(Obj(ffi::Py_NewRef(types.one))) } else { None }
                    } else {
                        p.int_in(1, MAX_SCHEMA_VERSION)
                    }
                }
            };
            f[slot] = v;
            f[slot].is_some()
        });
        if !ok || self.i != self.s.len() || f[..5].iter().any(|x| x.is_none()) {
            return None;
        }
        for (slot, v) in f.iter_mut().enumerate().skip(F_OCCURRED_AT) {
            if v.is_none() {
                *v = Some(match slot {
                    F_HEADERS => Obj::new(ffi::PyDict_New())?,
                    F_VERSION => Obj(ffi::Py_NewRef(types.one)),
                    _ => Obj::none(),
                });
            }
        }
        let values = f.map(|v| v.expect("filled above"));
        new_slotted(types.message, &types.message_offsets, values)
    }
}

// ---------------------------------------------------------------- the batch

/// Reads `Message`'s and `Source`'s slot offsets from their member descriptors (checked
/// to be writable object slots of that class). Called once, by
/// `aggregates.message.fastbatch`, which then checks a probe line against Python's build.
#[pyfunction]
fn envelope_init(
    message: &Bound<'_, PyAny>,
    message_slots: &Bound<'_, PyTuple>,
    source: &Bound<'_, PyAny>,
    source_slots: &Bound<'_, PyTuple>,
) -> PyResult<()> {
    let names: Vec<String> = message_slots.extract()?;
    if names.len() != 11 || names.iter().zip(FIELDS).any(|(a, b)| a.as_bytes() != b) {
        return Err(PyValueError::new_err("Message's slots are not the envelope's fields"));
    }
    let src: Vec<String> = source_slots.extract()?;
    if src != ["type", "id", "seq"] {
        return Err(PyValueError::new_err("Source's slots are not type, id, seq"));
    }
    let mut message_offsets = [0isize; 11];
    for (i, n) in names.iter().enumerate() {
        message_offsets[i] = slot_offset(message, n)?;
    }
    let mut source_offsets = [0isize; 3];
    for (i, n) in src.iter().enumerate() {
        source_offsets[i] = slot_offset(source, n)?;
    }
    // SAFETY: the GIL is held; imports the datetime C API once.
    unsafe {
        ffi::PyDateTime_IMPORT();
        if ffi::PyDateTimeAPI().is_null() {
            return Err(PyErr::fetch(message.py()));
        }
    }
    let _ = TYPES.set(Types {
        message: message.as_ptr() as *mut ffi::PyTypeObject,
        message_offsets,
        source: source.as_ptr() as *mut ffi::PyTypeObject,
        source_offsets,
        // SAFETY: the GIL is held; a new reference, never released.
        one: unsafe { ffi::PyLong_FromLong(1) },
        _keep: (message.clone().unbind(), source.clone().unbind()),
    });
    Ok(())
}

/// The offset of slot `name` of class `cls` (a writable object slot of exactly that class).
fn slot_offset(cls: &Bound<'_, PyAny>, name: &str) -> PyResult<isize> {
    let bad = || PyTypeError::new_err(format!("{name} is not a plain slot"));
    // SAFETY: type checks before every cast; the GIL is held.
    unsafe {
        if ffi::PyType_Check(cls.as_ptr()) == 0 {
            return Err(PyTypeError::new_err("not a class"));
        }
        let t = cls.as_ptr() as *mut ffi::PyTypeObject;
        if (*t).tp_itemsize != 0 || (*t).tp_alloc.is_none() {
            return Err(bad());
        }
        let d = cls.getattr("__dict__")?.get_item(name)?;
        if ffi::Py_TYPE(d.as_ptr()) != addr_of_mut!(ffi::PyMemberDescr_Type) {
            return Err(bad());
        }
        let descr = d.as_ptr() as *mut ffi::PyMemberDescrObject;
        if (*descr).d_common.d_type != t {
            return Err(bad());
        }
        // pyo3-ffi types `d_member` as a PyGetSetDef pointer; CPython's is a PyMemberDef.
        let m = (*descr).d_member as *const ffi::PyMemberDef;
        let off = (*m).offset;
        let size = std::mem::size_of::<*mut ffi::PyObject>() as isize;
        if (*m).type_code != T_OBJECT_EX || (*m).flags & READONLY != 0
            || off < std::mem::size_of::<ffi::PyObject>() as isize || off + size > (*t).tp_basicsize
        {
            return Err(bad());
        }
        Ok(off)
    }
}

/// The `_raw` column of an Arrow batch (a string or large string array: its `data`,
/// `offsets` and `validity` buffers, its `offset` and `length`) parsed row by row:
/// `(proven, texts, bad, left)` — each row's Message or None; each row's `str` where it has
/// no Message (None: proven, null, or not UTF-8); the rows that are not valid UTF-8, as
/// `(row, bytes)`; the rows neither proven nor skipped that have a text (for Python's fast
/// path). Rows where `skip[row]` is true are not parsed (their text is given).
/// `max_payload_bytes` bounds the proven lines' length as `fast_messages` does.
#[pyfunction]
#[pyo3(signature = (data, offsets, validity, offset, length, large, max_payload_bytes, skip=None))]
#[allow(clippy::too_many_arguments)]
fn prove_envelopes<'py>(
    py: Python<'py>,
    data: Option<&Bound<'py, PyAny>>,
    offsets: &Bound<'py, PyAny>,
    validity: Option<&Bound<'py, PyAny>>,
    offset: usize,
    length: usize,
    large: bool,
    max_payload_bytes: usize,
    skip: Option<&Bound<'py, PyList>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let types = TYPES
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("_aggbox_native.envelope_init was not called"))?;
    let data = data.map(Buf::get).transpose()?;
    let offs = Buf::get(offsets)?;
    let valid = validity.map(Buf::get).transpose()?;
    let data: &[u8] = data.as_ref().map_or(&[], |b| b.bytes());
    let offs = offs.bytes();
    let valid = valid.as_ref().map(|b| b.bytes());
    let width = if large { 8 } else { 4 };
    if offs.len() < (offset + length + 1) * width {
        return Err(PyValueError::new_err("the offsets buffer is shorter than the array"));
    }
    if let Some(v) = valid {
        if v.len() * 8 < offset + length {
            return Err(PyValueError::new_err("the validity bitmap is shorter than the array"));
        }
    }
    if let Some(s) = skip {
        if s.len() != length {
            return Err(PyValueError::new_err("skip has not one entry per row"));
        }
    }
    let at = |i: usize| -> i64 {
        let p = &offs[i * width..i * width + width];
        if large {
            i64::from_le_bytes(p.try_into().expect("8 bytes"))
        } else {
            i32::from_le_bytes(p.try_into().expect("4 bytes")) as i64
        }
    };
    let limit = if max_payload_bytes > 0 { max_payload_bytes / BSON_PER_CHAR } else { MAX_FAST_CHARS };
    let proven = none_list(py, length)?;
    let texts = none_list(py, length)?;
    let bad = PyList::empty(py);
    let left = PyList::empty(py);
    let mut p = Parser {
        s: &[],
        i: 0,
        scratch: Vec::new(),
        last_at: (0, [0; 3], [0; 3]),
        at_tail: [0; 7],
        last_dt: None,
        nonascii: false,
        memo: (0..1 << MEMO_BITS)
            .map(|_| MemoEntry { words: [0; 3], len: 0, obj: Obj(std::ptr::null_mut()) })
            .collect(),
    };
    for row in 0..length {
        let k = offset + row;
        if let Some(v) = valid {
            if v[k >> 3] >> (k & 7) & 1 == 0 {
                continue; // null
            }
        }
        let (a, b) = (at(k), at(k + 1));
        if a < 0 || b < a || b as usize > data.len() {
            return Err(PyValueError::new_err("the offsets point outside the data buffer"));
        }
        let line = &data[a as usize..b as usize];
        let skipped = match skip {
            Some(s) => s.get_item(row)?.is_truthy()?,
            None => false,
        };
        let fits = line.len() <= limit
            || line.iter().filter(|&&c| c & 0xc0 != 0x80).count() <= limit;
        if !skipped && fits && line.first() == Some(&b'{') {
            p.s = line;
            p.i = 0;
            p.nonascii = false;
            // SAFETY: the GIL is held; the parser only builds exact built-in objects and
            // the two registered classes' instances.
            if let Some(msg) = unsafe { p.message(types) } {
                // Outside strings the grammar allows ASCII only: an ASCII line is UTF-8.
                if !p.nonascii || std::str::from_utf8(line).is_ok() {
                    // SAFETY: `proven` has `length` items; SetItem steals the reference.
                    unsafe {
                        ffi::PyList_SetItem(proven.as_ptr(), row as ffi::Py_ssize_t, msg.into_raw());
                    }
                    continue;
                }
            }
        }
        if std::str::from_utf8(line).is_err() {
            bad.append((row, PyBytes::new(py, line)))?;
            continue;
        }
        // SAFETY: valid UTF-8 (checked above); the GIL is held.
        let text = unsafe { new_str(line, false) }
            .ok_or_else(|| PyRuntimeError::new_err("cannot build a str of a record"))?;
        unsafe { ffi::PyList_SetItem(texts.as_ptr(), row as ffi::Py_ssize_t, text.into_raw()) };
        if !skipped {
            left.append(row)?;
        }
    }
    PyTuple::new(py, [proven.into_any(), texts.into_any(), bad.into_any(), left.into_any()])
}

/// `[None] * n`.
fn none_list(py: Python<'_>, n: usize) -> PyResult<Bound<'_, PyList>> {
    // SAFETY: the GIL is held; every item is set before the list is used.
    unsafe {
        let l = ffi::PyList_New(n as ffi::Py_ssize_t);
        if l.is_null() {
            return Err(PyErr::fetch(py));
        }
        for i in 0..n {
            ffi::PyList_SET_ITEM(l, i as ffi::Py_ssize_t, ffi::Py_NewRef(ffi::Py_None()));
        }
        Ok(Bound::from_owned_ptr(py, l).cast_into_unchecked())
    }
}

/// Adds the parse's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(envelope_init, m)?)?;
    m.add_function(wrap_pyfunction!(prove_envelopes, m)?)?;
    Ok(())
}

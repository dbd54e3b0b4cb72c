//! aggbox's native core (docs/design.md "The hot path"): the pure, user-code-free pieces of the
//! writer's hot path — the canonical JSON + blake2b payload hash and the uuid5 ids of
//! `aggregates/core/ids.py`, byte for byte.
//!
//! Contract: for every input, the result is exactly what the Python definition gives. The
//! native path handles only exact `dict` (with exact `str` keys), `list`, `tuple`, `str`
//! (UTF-8 encodable), `int`, `float`, `bool` and `None`; anything else (datetime, bytes,
//! subclasses, lone surrogates, nesting deeper than `MAX_DEPTH`, ints `str()` refuses) makes
//! it call the Python definition registered with `init`, which also raises what Python
//! raises (circular references, unencodable names).

mod bsonw;
mod envelope;
mod fold;
mod records;
mod slots;
mod snap;
mod values;
mod write;

use std::io::Write;
use std::ptr::addr_of_mut;
use std::sync::OnceLock;

use blake2::digest::{Update, VariableOutput};
use blake2::Blake2bVar;
use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use sha1::{Digest, Sha1};

/// Deeper nesting is left to Python (its own recursion and cycle checks).
const MAX_DEPTH: u32 = 200;
const HEX: &[u8; 16] = b"0123456789abcdef";

struct Fallbacks {
    namespace: [u8; 16],
    payload_hash: Py<PyAny>,
    emitted_message_id: Py<PyAny>,
    uuid5: Py<PyAny>,
}

static FALLBACKS: OnceLock<Fallbacks> = OnceLock::new();

fn fallbacks() -> PyResult<&'static Fallbacks> {
    FALLBACKS
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("_aggbox_native.init was not called"))
}

// ---------------------------------------------------------------- canonical JSON

/// `json.dumps(o, sort_keys=True, separators=(",", ":"))` (ensure_ascii) into `out`; false
/// when `o` holds something this encoder leaves to Python.
///
/// Safety: `o` is a valid object and the GIL is held. No Python code runs during the walk
/// (only exact built-in types are visited), so borrowed items stay alive.
unsafe fn encode(out: &mut Vec<u8>, o: *mut ffi::PyObject, depth: u32) -> bool {
    if o == ffi::Py_None() {
        out.extend_from_slice(b"null");
        return true;
    }
    if o == ffi::Py_True() {
        out.extend_from_slice(b"true");
        return true;
    }
    if o == ffi::Py_False() {
        out.extend_from_slice(b"false");
        return true;
    }
    let t = ffi::Py_TYPE(o);
    if t == addr_of_mut!(ffi::PyUnicode_Type) {
        return encode_str(out, o);
    }
    if t == addr_of_mut!(ffi::PyLong_Type) {
        return encode_int(out, o);
    }
    if t == addr_of_mut!(ffi::PyFloat_Type) {
        encode_float(out, ffi::PyFloat_AsDouble(o));
        return true;
    }
    if depth >= MAX_DEPTH {
        return false;
    }
    if t == addr_of_mut!(ffi::PyDict_Type) {
        return encode_dict(out, o, depth + 1);
    }
    let (n, items) = if t == addr_of_mut!(ffi::PyList_Type) {
        (ffi::PyList_GET_SIZE(o), (*(o as *mut ffi::PyListObject)).ob_item)
    } else if t == addr_of_mut!(ffi::PyTuple_Type) {
        (
            ffi::PyTuple_GET_SIZE(o),
            (*(o as *mut ffi::PyTupleObject)).ob_item.as_mut_ptr(),
        )
    } else {
        return false;
    };
    out.push(b'[');
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        if !encode(out, *items.offset(i), depth + 1) {
            return false;
        }
    }
    out.push(b']');
    true
}

unsafe fn utf8_of<'a>(o: *mut ffi::PyObject) -> Option<&'a [u8]> {
    let mut size: ffi::Py_ssize_t = 0;
    let p = ffi::PyUnicode_AsUTF8AndSize(o, &mut size);
    if p.is_null() {
        ffi::PyErr_Clear(); // lone surrogates: Python's definition handles them
        return None;
    }
    Some(std::slice::from_raw_parts(p as *const u8, size as usize))
}

unsafe fn encode_str(out: &mut Vec<u8>, o: *mut ffi::PyObject) -> bool {
    match utf8_of(o) {
        Some(s) => {
            escape_ascii(out, s);
            true
        }
        None => false,
    }
}

/// json's `ascii_escape_unicode`: `"`, `\`, `\b\f\n\r\t` escaped by letter, every other
/// character outside 0x20..=0x7e as `\uxxxx` (lowercase), astral ones as surrogate pairs.
fn escape_ascii(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\' {
            i += 1;
            continue;
        }
        out.extend_from_slice(&s[start..i]);
        let (c, len) = decode_utf8(&s[i..]);
        i += len;
        start = i;
        out.push(b'\\');
        match c {
            0x5c => out.push(b'\\'),
            0x22 => out.push(b'"'),
            0x08 => out.push(b'b'),
            0x0c => out.push(b'f'),
            0x0a => out.push(b'n'),
            0x0d => out.push(b'r'),
            0x09 => out.push(b't'),
            _ => {
                if c >= 0x10000 {
                    let v = c - 0x10000;
                    push_u4(out, 0xd800 | (v >> 10));
                    out.push(b'\\');
                    push_u4(out, 0xdc00 | (v & 0x3ff));
                } else {
                    push_u4(out, c);
                }
            }
        }
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

fn push_u4(out: &mut Vec<u8>, c: u32) {
    out.extend_from_slice(&[
        b'u',
        HEX[(c >> 12 & 15) as usize],
        HEX[(c >> 8 & 15) as usize],
        HEX[(c >> 4 & 15) as usize],
        HEX[(c & 15) as usize],
    ]);
}

/// One code point of valid UTF-8 (CPython's UTF-8 of a str without surrogates).
fn decode_utf8(s: &[u8]) -> (u32, usize) {
    let b0 = s[0] as u32;
    if b0 < 0x80 {
        (b0, 1)
    } else if b0 < 0xe0 {
        (((b0 & 0x1f) << 6) | (s[1] as u32 & 0x3f), 2)
    } else if b0 < 0xf0 {
        (
            ((b0 & 0x0f) << 12) | ((s[1] as u32 & 0x3f) << 6) | (s[2] as u32 & 0x3f),
            3,
        )
    } else {
        (
            ((b0 & 0x07) << 18)
                | ((s[1] as u32 & 0x3f) << 12)
                | ((s[2] as u32 & 0x3f) << 6)
                | (s[3] as u32 & 0x3f),
            4,
        )
    }
}

unsafe fn encode_int(out: &mut Vec<u8>, o: *mut ffi::PyObject) -> bool {
    let mut overflow: std::os::raw::c_int = 0;
    let v = ffi::PyLong_AsLongLongAndOverflow(o, &mut overflow);
    if overflow == 0 {
        push_i64(out, v);
        return true;
    }
    // int.__repr__, as json does (it may refuse past sys.get_int_max_str_digits: Python's).
    let s = ffi::PyObject_Str(o);
    if s.is_null() {
        ffi::PyErr_Clear();
        return false;
    }
    let ok = match utf8_of(s) {
        Some(b) => {
            out.extend_from_slice(b);
            true
        }
        None => false,
    };
    ffi::Py_DECREF(s);
    ok
}

pub(crate) fn push_i64(out: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut u = v.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[i..]);
}

/// `float.__repr__` (and json's NaN / Infinity / -Infinity): the shortest round-tripping
/// digits, positional when the decimal exponent is in [-4, 16), else `d.ddde+XX`.
pub(crate) fn encode_float(out: &mut Vec<u8>, x: f64) {
    if x.is_nan() {
        out.extend_from_slice(b"NaN");
        return;
    }
    if x.is_infinite() {
        out.extend_from_slice(if x > 0.0 { b"Infinity" } else { b"-Infinity" });
        return;
    }
    // Rust's `{:e}` is the shortest round-tripping form too: "-1.2345e-5", "0e0".
    let mut sci = [0u8; 40];
    let n = {
        let mut cur = std::io::Cursor::new(&mut sci[..]);
        write!(cur, "{:e}", x).expect("40 bytes hold any f64");
        cur.position() as usize
    };
    let sci = &sci[..n];
    let (neg, body) = if sci[0] == b'-' { (true, &sci[1..]) } else { (false, sci) };
    let epos = body.iter().position(|&b| b == b'e').expect("{:e} has an exponent");
    let mut digits = [0u8; 24];
    let mut nd = 0;
    for &b in &body[..epos] {
        if b != b'.' {
            digits[nd] = b;
            nd += 1;
        }
    }
    let digits = &digits[..nd];
    let exp: i32 = std::str::from_utf8(&body[epos + 1..]).unwrap().parse().unwrap();
    let decpt = exp + 1; // value = 0.d1d2... × 10^decpt
    if neg {
        out.push(b'-');
    }
    if decpt <= -4 || decpt > 16 {
        out.push(digits[0]);
        if nd > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let a = exp.unsigned_abs();
        if a < 10 {
            out.push(b'0');
        }
        push_i64(out, a as i64);
    } else if decpt <= 0 {
        out.extend_from_slice(b"0.");
        for _ in 0..(-decpt) {
            out.push(b'0');
        }
        out.extend_from_slice(digits);
    } else if decpt as usize >= nd {
        out.extend_from_slice(digits);
        for _ in 0..(decpt as usize - nd) {
            out.push(b'0');
        }
        out.extend_from_slice(b".0");
    } else {
        out.extend_from_slice(&digits[..decpt as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[decpt as usize..]);
    }
}

unsafe fn encode_dict(out: &mut Vec<u8>, o: *mut ffi::PyObject, depth: u32) -> bool {
    let n = ffi::PyDict_Size(o) as usize;
    if n == 0 {
        out.extend_from_slice(b"{}");
        return true;
    }
    let mut items: Vec<(&[u8], *mut ffi::PyObject)> = Vec::with_capacity(n);
    let mut pos: ffi::Py_ssize_t = 0;
    let mut k: *mut ffi::PyObject = std::ptr::null_mut();
    let mut v: *mut ffi::PyObject = std::ptr::null_mut();
    while ffi::PyDict_Next(o, &mut pos, &mut k, &mut v) != 0 {
        if ffi::Py_TYPE(k) != addr_of_mut!(ffi::PyUnicode_Type) {
            return false; // non-str keys: json's own conversions (and errors)
        }
        match utf8_of(k) {
            Some(s) => items.push((s, v)),
            None => return false,
        }
    }
    // Python orders str by code point; UTF-8 byte order is the same order.
    items.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (key, val)) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        escape_ascii(out, key);
        out.push(b':');
        if !encode(out, *val, depth) {
            return false;
        }
    }
    out.push(b'}');
    true
}

fn canonical(o: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    // SAFETY: the GIL is held (`Bound`), `o` is alive for the call.
    if unsafe { encode(&mut out, o.as_ptr(), 0) } {
        Some(out)
    } else {
        None
    }
}

fn hex_into(out: &mut Vec<u8>, bytes: &[u8]) {
    for b in bytes {
        out.push(HEX[(b >> 4) as usize]);
        out.push(HEX[(b & 15) as usize]);
    }
}

fn ascii_str<'py>(py: Python<'py>, s: &[u8]) -> Bound<'py, PyString> {
    // SAFETY: hex digits and dashes only: ASCII, valid UTF-8.
    PyString::new(py, unsafe { std::str::from_utf8_unchecked(s) })
}

fn blake2b_6(data: &[u8]) -> [u8; 6] {
    let mut h = Blake2bVar::new(6).expect("6 is a valid blake2b size");
    h.update(data);
    let mut d = [0u8; 6];
    h.finalize_variable(&mut d).expect("6-byte buffer");
    d
}

pub(crate) fn hash_one<'py>(py: Python<'py>, payload: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match canonical(payload) {
        Some(json) => {
            let mut hex = Vec::with_capacity(12);
            hex_into(&mut hex, &blake2b_6(&json));
            Ok(ascii_str(py, &hex).into_any())
        }
        None => fallbacks()?.payload_hash.bind(py).call1((payload,)),
    }
}

/// `aggregates.core.ids.payload_hash`: blake2b-48 of the canonical JSON, hex.
#[pyfunction]
fn payload_hash<'py>(py: Python<'py>, payload: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    hash_one(py, payload)
}

/// `[payload_hash(p) for p in payloads]` in one call.
#[pyfunction]
fn payload_hashes<'py>(py: Python<'py>, payloads: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for p in payloads.iter() {
        out.append(hash_one(py, &p)?)?;
    }
    Ok(out)
}

/// The canonical JSON, or None where Python's definition is needed (tests compare bytes).
#[pyfunction]
fn canonical_json<'py>(py: Python<'py>, value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyString>> {
    canonical(value).map(|b| PyString::new(py, std::str::from_utf8(&b).expect("ASCII")))
}

// ---------------------------------------------------------------- uuid5 ids

pub(crate) fn uuid5_str(out: &mut Vec<u8>, namespace: &[u8], name: &[u8]) {
    let mut h = Sha1::new();
    Digest::update(&mut h, namespace);
    Digest::update(&mut h, name);
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    hex_into(out, &b[..4]);
    out.push(b'-');
    hex_into(out, &b[4..6]);
    out.push(b'-');
    hex_into(out, &b[6..8]);
    out.push(b'-');
    hex_into(out, &b[8..10]);
    out.push(b'-');
    hex_into(out, &b[10..]);
}

/// (UTF-8, code point count) of an exact, UTF-8-encodable str.
fn exact_str<'a>(o: &'a Bound<'_, PyAny>) -> Option<(&'a [u8], usize)> {
    if !o.is_exact_instance_of::<PyString>() {
        return None;
    }
    // SAFETY: an exact str; the slice lives as long as the object (borrowed by `o`).
    unsafe {
        let s = utf8_of(o.as_ptr())?;
        Some((s, ffi::PyUnicode_GetLength(o.as_ptr()) as usize))
    }
}

fn exact_index(o: &Bound<'_, PyAny>) -> Option<i64> {
    if !o.is_exact_instance_of::<pyo3::types::PyInt>() {
        return None; // bool, IntEnum...: str() differs from the digits
    }
    o.extract::<i64>().ok()
}

/// The name `emitted_message_id` hashes: length-prefixed parts, without the index.
fn id_prefix(out: &mut Vec<u8>, parts: [(&[u8], usize); 3]) {
    for (s, n) in parts {
        push_i64(out, n as i64);
        out.push(b':');
        out.extend_from_slice(s);
    }
}

/// `aggregates.core.ids.emitted_message_id`.
#[pyfunction]
fn emitted_message_id<'py>(
    py: Python<'py>,
    aggregate_type: &Bound<'py, PyAny>,
    aggregate_id: &Bound<'py, PyAny>,
    causation_id: &Bound<'py, PyAny>,
    index: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let fb = fallbacks()?;
    if let (Some(t), Some(a), Some(c), Some(i)) = (
        exact_str(aggregate_type),
        exact_str(aggregate_id),
        exact_str(causation_id),
        exact_index(index),
    ) {
        let mut name = Vec::with_capacity(t.0.len() + a.0.len() + c.0.len() + 24);
        id_prefix(&mut name, [t, a, c]);
        push_i64(&mut name, i);
        let mut out = Vec::with_capacity(36);
        uuid5_str(&mut out, &fb.namespace, &name);
        return Ok(ascii_str(py, &out).into_any());
    }
    fb.emitted_message_id
        .bind(py)
        .call1((aggregate_type, aggregate_id, causation_id, index))
}

/// `[emitted_message_id(t, a, c, i) for i in range(count)]` in one call.
#[pyfunction]
fn emitted_message_ids<'py>(
    py: Python<'py>,
    aggregate_type: &Bound<'py, PyAny>,
    aggregate_id: &Bound<'py, PyAny>,
    causation_id: &Bound<'py, PyAny>,
    count: usize,
) -> PyResult<Bound<'py, PyList>> {
    let fb = fallbacks()?;
    let out = PyList::empty(py);
    if let (Some(t), Some(a), Some(c)) = (
        exact_str(aggregate_type),
        exact_str(aggregate_id),
        exact_str(causation_id),
    ) {
        let mut name = Vec::with_capacity(t.0.len() + a.0.len() + c.0.len() + 24);
        id_prefix(&mut name, [t, a, c]);
        let base = name.len();
        let mut id = Vec::with_capacity(36);
        for i in 0..count {
            name.truncate(base);
            push_i64(&mut name, i as i64);
            id.clear();
            uuid5_str(&mut id, &fb.namespace, &name);
            out.append(ascii_str(py, &id))?;
        }
        return Ok(out);
    }
    for i in 0..count {
        out.append(
            fb.emitted_message_id
                .bind(py)
                .call1((aggregate_type, aggregate_id, causation_id, i))?,
        )?;
    }
    Ok(out)
}

/// `aggregates.core.ids.uuid5`, the namespace given as its 16 bytes.
#[pyfunction]
fn uuid5<'py>(
    py: Python<'py>,
    namespace: &Bound<'py, PyBytes>,
    name: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let ns = namespace.as_bytes();
    match exact_str(name) {
        Some((s, _)) if ns.len() == 16 => {
            let mut out = Vec::with_capacity(36);
            uuid5_str(&mut out, ns, s);
            Ok(ascii_str(py, &out).into_any())
        }
        _ => fallbacks()?.uuid5.bind(py).call1((namespace, name)),
    }
}

// ---------------------------------------------------------------- module

/// Registers aggbox's namespace and the Python definitions used for what the native path
/// leaves to Python. Called once, by `aggregates.core.ids`.
#[pyfunction]
fn init(
    namespace: &Bound<'_, PyBytes>,
    payload_hash: Py<PyAny>,
    emitted_message_id: Py<PyAny>,
    uuid5: Py<PyAny>,
) -> PyResult<()> {
    let ns: [u8; 16] = namespace
        .as_bytes()
        .try_into()
        .map_err(|_| PyRuntimeError::new_err("the namespace is 16 bytes"))?;
    let _ = FALLBACKS.set(Fallbacks { namespace: ns, payload_hash, emitted_message_id, uuid5 });
    Ok(())
}

/// Nothing: the cost of one Python → native call (bench).
#[pyfunction]
fn noop() {}

#[pymodule]
fn _aggbox_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(payload_hash, m)?)?;
    m.add_function(wrap_pyfunction!(payload_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_json, m)?)?;
    m.add_function(wrap_pyfunction!(emitted_message_id, m)?)?;
    m.add_function(wrap_pyfunction!(emitted_message_ids, m)?)?;
    m.add_function(wrap_pyfunction!(uuid5, m)?)?;
    m.add_function(wrap_pyfunction!(noop, m)?)?;
    fold::register(m)?;
    envelope::register(m)?;
    records::register(m)?;
    Ok(())
}

//! A small BSON writer and reader for the batch fold (docs/design.md "The hot path"): the
//! documents the writer sends are built here as bytes, exactly as pymongo's encoder would
//! encode the Python objects the pure path builds (`bson.encode`: an int is an int32 when it
//! fits, else an int64; a datetime is UTC milliseconds; keys in insertion order), and the
//! documents read are parsed without building Python objects.
//!
//! Python values are encoded natively only when they are of exact built-in types (and a
//! datetime in UTC); any other value is handed to the Python encoder registered by the glue
//! (`bson.encode({"v": value}, codec_options=...)`) and its element copied, so the bytes are
//! pymongo's whatever the value.

use std::ptr::addr_of_mut;

use pyo3::ffi;
use pyo3::prelude::*;

pub const T_DOUBLE: u8 = 0x01;
pub const T_STRING: u8 = 0x02;
pub const T_DOC: u8 = 0x03;
pub const T_ARRAY: u8 = 0x04;
pub const T_BOOL: u8 = 0x08;
pub const T_DATE: u8 = 0x09;
pub const T_NULL: u8 = 0x0A;
pub const T_INT32: u8 = 0x10;
pub const T_INT64: u8 = 0x12;

// ---------------------------------------------------------------- writing

/// A document or array being written into a shared buffer: `end` patches its length.
pub struct Open(usize);

pub fn open(buf: &mut Vec<u8>) -> Open {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0, 0, 0]);
    Open(at)
}

pub fn end(buf: &mut Vec<u8>, o: Open) {
    buf.push(0);
    let n = (buf.len() - o.0) as i32;
    buf[o.0..o.0 + 4].copy_from_slice(&n.to_le_bytes());
}

pub fn key(buf: &mut Vec<u8>, t: u8, name: &[u8]) {
    buf.push(t);
    buf.extend_from_slice(name);
    buf.push(0);
}

pub fn put_str(buf: &mut Vec<u8>, name: &[u8], s: &[u8]) {
    key(buf, T_STRING, name);
    buf.extend_from_slice(&((s.len() + 1) as i32).to_le_bytes());
    buf.extend_from_slice(s);
    buf.push(0);
}

/// An int as pymongo encodes a Python int: int32 when it fits, else int64.
pub fn put_int(buf: &mut Vec<u8>, name: &[u8], v: i64) {
    if v >= i32::MIN as i64 && v <= i32::MAX as i64 {
        key(buf, T_INT32, name);
        buf.extend_from_slice(&(v as i32).to_le_bytes());
    } else {
        key(buf, T_INT64, name);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

pub fn put_date(buf: &mut Vec<u8>, name: &[u8], ms: i64) {
    key(buf, T_DATE, name);
    buf.extend_from_slice(&ms.to_le_bytes());
}

pub fn put_null(buf: &mut Vec<u8>, name: &[u8]) {
    key(buf, T_NULL, name);
}

pub fn put_bool(buf: &mut Vec<u8>, name: &[u8], b: bool) {
    key(buf, T_BOOL, name);
    buf.push(b as u8);
}

// ---------------------------------------------------------------- Python values

/// Why a Python value was not encoded natively.
pub enum Unencoded {
    /// Not of a type encoded here: the Python encoder decides (and may raise).
    Foreign,
    /// Python raised (the error is set; the caller fetches it).
    Error,
}

/// UTF-8 of an exact str, or None (lone surrogates: the error is cleared).
///
/// Safety: `o` is an exact str and the GIL is held.
pub unsafe fn utf8<'a>(o: *mut ffi::PyObject) -> Option<&'a [u8]> {
    let mut size: ffi::Py_ssize_t = 0;
    let p = ffi::PyUnicode_AsUTF8AndSize(o, &mut size);
    if p.is_null() {
        ffi::PyErr_Clear();
        return None;
    }
    Some(std::slice::from_raw_parts(p as *const u8, size as usize))
}

pub unsafe fn is_exact(o: *mut ffi::PyObject, t: *mut ffi::PyTypeObject) -> bool {
    ffi::Py_TYPE(o) == t
}

pub unsafe fn is_str(o: *mut ffi::PyObject) -> bool {
    is_exact(o, addr_of_mut!(ffi::PyUnicode_Type))
}

pub unsafe fn is_int(o: *mut ffi::PyObject) -> bool {
    is_exact(o, addr_of_mut!(ffi::PyLong_Type))
}

pub unsafe fn is_dict(o: *mut ffi::PyObject) -> bool {
    is_exact(o, addr_of_mut!(ffi::PyDict_Type))
}

pub unsafe fn is_list(o: *mut ffi::PyObject) -> bool {
    is_exact(o, addr_of_mut!(ffi::PyList_Type))
}

pub unsafe fn is_tuple(o: *mut ffi::PyObject) -> bool {
    is_exact(o, addr_of_mut!(ffi::PyTuple_Type))
}

pub unsafe fn is_float(o: *mut ffi::PyObject) -> bool {
    is_exact(o, addr_of_mut!(ffi::PyFloat_Type))
}

/// An exact int that fits in 64 bits.
pub unsafe fn int64(o: *mut ffi::PyObject) -> Option<i64> {
    let mut overflow: std::os::raw::c_int = 0;
    let v = ffi::PyLong_AsLongLongAndOverflow(o, &mut overflow);
    if overflow != 0 {
        return None;
    }
    if v == -1 && !ffi::PyErr_Occurred().is_null() {
        ffi::PyErr_Clear();
        return None;
    }
    Some(v)
}

/// Milliseconds since the epoch of an exact datetime that is naive or in UTC
/// (`timezone.utc`), as pymongo computes them; None for anything else.
pub unsafe fn datetime_ms(o: *mut ffi::PyObject, utc: *mut ffi::PyObject) -> Option<i64> {
    let api = ffi::PyDateTimeAPI();
    if api.is_null() || ffi::Py_TYPE(o) != (*api).DateTimeType {
        return None;
    }
    let dt = o as *mut ffi::PyDateTime_DateTime;
    if (*dt).hastzinfo != 0 && (*dt).tzinfo != utc {
        return None;
    }
    let y = ffi::PyDateTime_GET_YEAR(o) as i64;
    let mo = ffi::PyDateTime_GET_MONTH(o) as i64;
    let d = ffi::PyDateTime_GET_DAY(o) as i64;
    let h = ffi::PyDateTime_DATE_GET_HOUR(o) as i64;
    let mi = ffi::PyDateTime_DATE_GET_MINUTE(o) as i64;
    let s = ffi::PyDateTime_DATE_GET_SECOND(o) as i64;
    let us = ffi::PyDateTime_DATE_GET_MICROSECOND(o) as i64;
    let days = days_from_civil(y, mo, d);
    Some(((days * 86400 + h * 3600 + mi * 60 + s) * 1000) + us / 1000)
}

/// Microseconds since the epoch of the same datetimes as [`datetime_ms`].
pub unsafe fn datetime_us(o: *mut ffi::PyObject, utc: *mut ffi::PyObject) -> Option<i64> {
    let ms = datetime_ms(o, utc)?;
    let us = ffi::PyDateTime_DATE_GET_MICROSECOND(o) as i64;
    Some(ms.div_euclid(1000) * 1_000_000 + us)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// Writes value `o` as the element `name` (an index when `name` is None) of the document
/// being written; plain JSON-like values natively, anything else through `fallback`
/// (`bson.encode({"v": value})` in Python). `depth` bounds the native recursion.
///
/// Safety: GIL held; `o` alive.
pub unsafe fn put_value(
    py: Python<'_>,
    buf: &mut Vec<u8>,
    name: &[u8],
    o: *mut ffi::PyObject,
    utc: *mut ffi::PyObject,
    fallback: &Bound<'_, PyAny>,
    depth: u32,
) -> Result<(), Unencoded> {
    if o == ffi::Py_None() {
        put_null(buf, name);
        return Ok(());
    }
    if o == ffi::Py_True() || o == ffi::Py_False() {
        put_bool(buf, name, o == ffi::Py_True());
        return Ok(());
    }
    if is_str(o) {
        return match utf8(o) {
            Some(s) => {
                put_str(buf, name, s);
                Ok(())
            }
            None => foreign(py, buf, name, o, fallback),
        };
    }
    if is_int(o) {
        return match int64(o) {
            Some(v) => {
                put_int(buf, name, v);
                Ok(())
            }
            None => foreign(py, buf, name, o, fallback),
        };
    }
    if is_float(o) {
        key(buf, T_DOUBLE, name);
        buf.extend_from_slice(&ffi::PyFloat_AsDouble(o).to_le_bytes());
        return Ok(());
    }
    if depth < 90 {
        if is_dict(o) {
            let at = buf.len();
            key(buf, T_DOC, name);
            if put_dict_body(py, buf, o, utc, fallback, depth + 1)? {
                return Ok(());
            }
            buf.truncate(at);
            return foreign(py, buf, name, o, fallback);
        }
        if is_list(o) || is_tuple(o) {
            key(buf, T_ARRAY, name);
            let (n, items) = seq_items(o);
            let doc = open(buf);
            for i in 0..n {
                let mut kb = Vec::with_capacity(8);
                index_name(&mut kb, i as usize);
                put_value(py, buf, &kb, *items.offset(i), utc, fallback, depth + 1)?;
            }
            end(buf, doc);
            return Ok(());
        }
    }
    if let Some(ms) = datetime_ms(o, utc) {
        put_date(buf, name, ms);
        return Ok(());
    }
    foreign(py, buf, name, o, fallback)
}

/// A dict's elements as a document body (length, elements, terminator); `Ok(false)` when a
/// key cannot be written natively (a non-str key, NUL, lone surrogate): the caller hands
/// the whole dict to Python.
pub unsafe fn put_dict_body(
    py: Python<'_>,
    buf: &mut Vec<u8>,
    o: *mut ffi::PyObject,
    utc: *mut ffi::PyObject,
    fallback: &Bound<'_, PyAny>,
    depth: u32,
) -> Result<bool, Unencoded> {
    let doc = open(buf);
    let mut pos: ffi::Py_ssize_t = 0;
    let mut k: *mut ffi::PyObject = std::ptr::null_mut();
    let mut v: *mut ffi::PyObject = std::ptr::null_mut();
    while ffi::PyDict_Next(o, &mut pos, &mut k, &mut v) != 0 {
        if !is_str(k) {
            return Ok(false);
        }
        let ks = match utf8(k) {
            Some(s) if !s.contains(&0) => s,
            _ => return Ok(false),
        };
        // The key bytes are borrowed from the str, alive while the dict holds it.
        put_value(py, buf, ks, v, utc, fallback, depth)?;
    }
    end(buf, doc);
    Ok(true)
}

/// The size and items of an exact list or tuple.
///
/// Safety: `o` is an exact list or tuple.
pub unsafe fn seq_items(o: *mut ffi::PyObject) -> (ffi::Py_ssize_t, *mut *mut ffi::PyObject) {
    if is_list(o) {
        (ffi::PyList_GET_SIZE(o), (*(o as *mut ffi::PyListObject)).ob_item)
    } else {
        (ffi::PyTuple_GET_SIZE(o), (*(o as *mut ffi::PyTupleObject)).ob_item.as_mut_ptr())
    }
}

pub fn index_name(kb: &mut Vec<u8>, i: usize) {
    let mut tmp = [0u8; 20];
    let mut n = tmp.len();
    let mut v = i;
    loop {
        n -= 1;
        tmp[n] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    kb.extend_from_slice(&tmp[n..]);
}

/// The element of `o` as Python's encoder writes it: `fallback(o)` returns
/// `bson.encode({"v": o})`, whose single element (type, `v\0`, value) is copied under `name`.
unsafe fn foreign(
    py: Python<'_>,
    buf: &mut Vec<u8>,
    name: &[u8],
    o: *mut ffi::PyObject,
    fallback: &Bound<'_, PyAny>,
) -> Result<(), Unencoded> {
    let value = Bound::from_borrowed_ptr(py, o);
    let encoded = match fallback.call1((value,)) {
        Ok(b) => b,
        Err(e) => {
            e.restore(py);
            return Err(Unencoded::Error);
        }
    };
    let encoded = match encoded.cast::<pyo3::types::PyBytes>() {
        Ok(b) => b.clone(),
        Err(e) => {
            PyErr::from(e).restore(py);
            return Err(Unencoded::Error);
        }
    };
    let bytes = encoded.as_bytes();
    // [len:4][type:1]["v\0":2][value...][0:1]
    if bytes.len() < 8 || &bytes[5..7] != b"v\0" {
        return Err(Unencoded::Foreign);
    }
    buf.push(bytes[4]);
    buf.extend_from_slice(name);
    buf.push(0);
    buf.extend_from_slice(&bytes[7..bytes.len() - 1]);
    Ok(())
}

// ---------------------------------------------------------------- reading

/// One element of a document: its type, name and value bytes.
pub struct Elem<'a> {
    pub t: u8,
    pub name: &'a [u8],
    pub value: &'a [u8],
}

impl<'a> Elem<'a> {
    pub fn int(&self) -> Option<i64> {
        match self.t {
            T_INT32 => Some(i32::from_le_bytes(self.value[..4].try_into().ok()?) as i64),
            T_INT64 => Some(i64::from_le_bytes(self.value[..8].try_into().ok()?)),
            _ => None,
        }
    }
    pub fn int32(&self) -> Option<i64> {
        if self.t == T_INT32 {
            self.int()
        } else {
            None
        }
    }
    pub fn date(&self) -> Option<i64> {
        if self.t == T_DATE {
            Some(i64::from_le_bytes(self.value[..8].try_into().ok()?))
        } else {
            None
        }
    }
    pub fn string(&self) -> Option<&'a [u8]> {
        if self.t != T_STRING || self.value.len() < 5 {
            return None;
        }
        let n = i32::from_le_bytes(self.value[..4].try_into().ok()?) as usize;
        if n < 1 || 4 + n > self.value.len() {
            return None;
        }
        let s = &self.value[4..4 + n - 1];
        std::str::from_utf8(s).ok()?;
        Some(s)
    }
    pub fn doc(&self) -> Option<&'a [u8]> {
        if self.t == T_DOC || self.t == T_ARRAY {
            Some(self.value)
        } else {
            None
        }
    }
    pub fn is_null(&self) -> bool {
        self.t == T_NULL
    }
}

/// The elements of a document (or array) `doc` (its whole bytes, length included); None
/// when it is not well-formed.
pub fn elements(doc: &[u8]) -> Option<Vec<Elem<'_>>> {
    if doc.len() < 5 {
        return None;
    }
    let n = i32::from_le_bytes(doc[..4].try_into().ok()?) as usize;
    if n != doc.len() || doc[n - 1] != 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut i = 4;
    while i < n - 1 {
        let t = doc[i];
        i += 1;
        let name_end = i + doc[i..n - 1].iter().position(|&b| b == 0)?;
        let name = &doc[i..name_end];
        i = name_end + 1;
        let size = value_size(t, &doc[i..n - 1])?;
        out.push(Elem { t, name, value: &doc[i..i + size] });
        i += size;
    }
    if i != n - 1 {
        return None;
    }
    Some(out)
}

fn le_i32(b: &[u8]) -> Option<usize> {
    let v = i32::from_le_bytes(b.get(..4)?.try_into().ok()?);
    if v < 0 {
        None
    } else {
        Some(v as usize)
    }
}

/// The size of a value of type `t` at the start of `rest`.
fn value_size(t: u8, rest: &[u8]) -> Option<usize> {
    let size = match t {
        0x01 | 0x09 | 0x11 | 0x12 => 8,
        0x02 | 0x0D | 0x0E => 4 + le_i32(rest)?,
        0x03 | 0x04 | 0x0F => le_i32(rest)?,
        0x05 => 5 + le_i32(rest)?,
        0x06 | 0x0A | 0xFF | 0x7F => 0,
        0x07 => 12,
        0x08 => 1,
        0x0B => {
            let a = rest.iter().position(|&b| b == 0)? + 1;
            a + rest[a..].iter().position(|&b| b == 0)? + 1
        }
        0x0C => 4 + le_i32(rest)? + 12,
        0x10 => 4,
        0x13 => 16,
        _ => return None,
    };
    if size > rest.len() {
        return None;
    }
    Some(size)
}

//! Tests of Python values the batch fold makes (pure, GIL held): what the definition would
//! store as it is, and how it is written as BSON.

use pyo3::ffi;

use crate::bsonw as b;
use crate::fold::M_AT;
use crate::slots::Slots;

/// occurred_at of a Message in milliseconds: Some(None) undated, None when it is not a
/// datetime this module reads (left to the definition).
///
/// Safety: `m` is a Message, GIL held.
pub(crate) unsafe fn msg_time_ms(slots: &Slots, m: *mut ffi::PyObject, utc: *mut ffi::PyObject) -> Option<Option<i64>> {
    let at = slots.get(m, M_AT);
    if at.is_null() {
        return None;
    }
    if at == ffi::Py_None() {
        return Some(None);
    }
    let api = ffi::PyDateTimeAPI();
    let dt = at as *mut ffi::PyDateTime_DateTime;
    if ffi::Py_TYPE(at) != (*api).DateTimeType || (*dt).hastzinfo == 0 || (*dt).tzinfo != utc {
        return None;
    }
    // Only whole milliseconds (what parse_time gives): the inbox stores milliseconds.
    if ffi::PyDateTime_DATE_GET_MICROSECOND(at) % 1000 != 0 {
        return None;
    }
    b::datetime_ms(at, utc).map(Some)
}

/// A str MongoDB can store, non-empty (`storable_text`): its UTF-8.
pub(crate) unsafe fn storable(o: *mut ffi::PyObject) -> Option<&'static [u8]> {
    if o.is_null() || !b::is_str(o) {
        return None;
    }
    let s = b::utf8(o)?;
    if s.is_empty() {
        None
    } else {
        Some(s)
    }
}

/// `hw_key(type, id)`: each part with `%`, `/`, `.`, `$` and NUL percent-encoded.
pub(crate) fn hw_key(t: &[u8], id: &[u8]) -> String {
    let mut out = Vec::with_capacity(t.len() + id.len() + 1);
    escape_field(&mut out, t);
    out.push(b'/');
    escape_field(&mut out, id);
    String::from_utf8(out).expect("escaped UTF-8")
}

pub(crate) fn escape_field(out: &mut Vec<u8>, s: &[u8]) {
    for &c in s {
        match c {
            b'%' => out.extend_from_slice(b"%25"),
            b'/' => out.extend_from_slice(b"%2F"),
            b'.' => out.extend_from_slice(b"%2E"),
            b'$' => out.extend_from_slice(b"%24"),
            0 => out.extend_from_slice(b"%00"),
            _ => out.push(c),
        }
    }
}

/// Whether `o` is plain JSON all the way down as `aggregates.core.jsonvalue` defines it (so
/// the definition stores it as it is): exact str (UTF-8), int in int64, finite float, bool,
/// None, dict with valid keys, list or tuple; at most `depth` levels deeper.
pub(crate) unsafe fn plain_json(o: *mut ffi::PyObject, depth: u32) -> bool {
    if o == ffi::Py_None() || o == ffi::Py_True() || o == ffi::Py_False() {
        return true;
    }
    if b::is_str(o) {
        return b::utf8(o).is_some();
    }
    if b::is_int(o) {
        return b::int64(o).is_some();
    }
    if b::is_float(o) {
        return ffi::PyFloat_AsDouble(o).is_finite();
    }
    if depth >= 60 {
        return false;
    }
    if b::is_dict(o) {
        let mut pos: ffi::Py_ssize_t = 0;
        let mut k: *mut ffi::PyObject = std::ptr::null_mut();
        let mut v: *mut ffi::PyObject = std::ptr::null_mut();
        while ffi::PyDict_Next(o, &mut pos, &mut k, &mut v) != 0 {
            if !plain_key(k) {
                return false;
            }
            if !plain_json(v, depth + 1) {
                return false;
            }
        }
        return true;
    }
    if b::is_list(o) || b::is_tuple(o) {
        let (n, items) = b::seq_items(o);
        for i in 0..n {
            if !plain_json(*items.offset(i), depth + 1) {
                return false;
            }
        }
        return true;
    }
    false
}

/// A key stored as it is: a `str`, not `$…`, without `.` or NUL.
unsafe fn plain_key(k: *mut ffi::PyObject) -> bool {
    b::is_str(k)
        && matches!(b::utf8(k),
                    Some(s) if s.first() != Some(&b'$') && !s.contains(&b'.') && !s.contains(&0))
}

/// A dict state the codec stores as it is (`to_bson` of plain values copies them; keys
/// checked by `check_field_names`): like [`plain_json`], NaN and infinities allowed.
pub(crate) unsafe fn plain_state(o: *mut ffi::PyObject, depth: u32) -> bool {
    if b::is_float(o) {
        return true;
    }
    if depth >= 60 {
        return false;
    }
    if b::is_dict(o) {
        let mut pos: ffi::Py_ssize_t = 0;
        let mut k: *mut ffi::PyObject = std::ptr::null_mut();
        let mut v: *mut ffi::PyObject = std::ptr::null_mut();
        while ffi::PyDict_Next(o, &mut pos, &mut k, &mut v) != 0 {
            if !plain_key(k) {
                return false;
            }
            if !plain_state(v, depth + 1) {
                return false;
            }
        }
        return true;
    }
    if b::is_list(o) {
        let n = ffi::PyList_GET_SIZE(o);
        for i in 0..n {
            if !plain_state(ffi::PyList_GET_ITEM(o, i), depth + 1) {
                return false;
            }
        }
        return true;
    }
    if b::is_tuple(o) {
        return false; // to_bson makes a list of it: the same BSON, but leave it to Python
    }
    plain_json(o, depth)
}


//! The end of a native fold: the state's encoding and the size budget, the dedup record's
//! part of the write (the inbox's push, slice and evictions with their archive documents, the
//! high-water marks, the run stamp), the write itself (the update of
//! `aggregates.store.update.build_update` or the document of `new_document`, field for
//! field) and the outcomes.

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::bsonw as b;
use crate::fold::{Dedup, Folder, NativeFold, M_AID, M_ATYPE, M_ID};
use crate::snap::{Entry, Run, Segment};

impl<'a> Folder<'a> {
    /// The inbox archive's document of an evicted entry, as
    /// `aggregates.dedup.archive.InboxArchive.write` builds it: `_id` (the length-prefixed
    /// key), `a`, `m`, `at` (archived at), `t`, `h` (when it has one), `w` (a run stamp's
    /// write version), `x` (the expiry: `max(t, now) + horizon + clock_skew`, put as far ahead
    /// of the store's clock as of the writer's; undated ids have none).
    pub(crate) fn archive_doc(&self, en: &Entry, horizon_us: i64, skew_us: i64) -> Vec<u8> {
        let mut buf = Vec::with_capacity(160);
        let doc = b::open(&mut buf);
        let mut key = Vec::with_capacity(self.snap.aid_b.len() + en.id.len() + 8);
        // SAFETY: aid_b is the UTF-8 of a str.
        let aid = unsafe { std::str::from_utf8_unchecked(&self.snap.aid_b) };
        crate::push_i64(&mut key, aid.chars().count() as i64);
        key.push(b':');
        key.extend_from_slice(&self.snap.aid_b);
        key.extend_from_slice(en.id.as_bytes());
        b::put_str(&mut buf, b"_id", &key);
        b::put_str(&mut buf, b"a", &self.snap.aid_b);
        b::put_str(&mut buf, b"m", en.id.as_bytes());
        b::put_date(&mut buf, b"at", self.now_ms);
        if let Some(ms) = en.t_ms {
            b::put_date(&mut buf, b"t", ms);
        }
        if let Some(h) = en.effective_hash() {
            b::put_str(&mut buf, b"h", h.as_bytes());
        }
        if let Some(tag) = en.tag {
            b::put_int(&mut buf, b"w", tag);
        }
        if let Some(ms) = en.t_ms {
            let expire = (ms * 1000).max(self.now_us) + horizon_us + skew_us;
            let x = match self.store_now_us {
                Some(sn) => sn + (expire - self.now_us),
                None => expire,
            };
            b::put_date(&mut buf, b"x", x.div_euclid(1000));
        }
        b::end(&mut buf, doc);
        buf
    }

    /// The end of the slice: sizes, the dedup record's part, the write and the outcomes.
    pub(crate) fn finish(mut self, py: Python<'_>, max_bytes: i64, attempt: i64) -> PyResult<Option<NativeFold>> {
        let e = self.e;
        let utc = e.utc.as_ptr();
        let fb = e.encode_value.bind(py);
        // The state document's BSON (the last dump, or the state encoded directly).
        let mut state_bson: Option<Vec<u8>> = None;
        if self.applied {
            let st = self.state.as_ref().unwrap();
            let mut buf = Vec::with_capacity(128);
            // SAFETY: GIL held; objects alive.
            let ok = unsafe {
                match &st.doc {
                    Some(d) => put_doc(py, &mut buf, d.as_ptr(), utc, fb)?,
                    None => {
                        if let Some((_, fields)) = &self.spec.fast_state {
                            let o = b::open(&mut buf);
                            for (name, _) in fields {
                                let v = st.obj.bind(py).getattr(name.bind(py))?;
                                put_py(py, &mut buf, name.bind(py).to_str()?.as_bytes(), v.as_ptr(), utc, fb)?;
                            }
                            b::end(&mut buf, o);
                            true
                        } else {
                            put_doc(py, &mut buf, st.obj.as_ptr(), utc, fb)?
                        }
                    }
                }
            };
            if !ok {
                return Ok(None);
            }
            // The fast pass's size (aggregates.fold._Folder._fast_size).
            let inbox = self.pending as i64 * 64;
            let both = if self.entries.is_empty() {
                buf.len() as i64
            } else {
                let arr: i64 = 4 + self
                    .entries
                    .iter()
                    .enumerate()
                    .map(|(i, d)| 2 + digits(i) + d.len() as i64)
                    .sum::<i64>()
                    + 1;
                // len(encode({"e": outbox, "s": state})) - 3
                (4 + 3 + arr + 3 + buf.len() as i64 + 1) - 3
            };
            let size = self.snap.size_bytes - self.snap.state_bytes + both + inbox;
            if size > max_bytes {
                return Ok(None);
            }
            self.snap.size_bytes = size;
            state_bson = Some(buf);
        }
        let version = self.snap.version + 1;
        // -- the dedup record's part (stamped_changes)
        let mut set_dedup: Vec<u8> = Vec::new(); // elements of $set (or the new document)
        let mut hw_elems: Vec<(String, i64)> = Vec::new();
        let mut inbox_push: Option<(Vec<u8>, i64)> = None; // ($each array, $slice)
        let archive = PyList::empty(py);
        let mut dedup_changed = false;
        match self.spec.dedup {
            Dedup::Inbox { window, horizon_us, skew_us, .. } if self.pending > 0 => {
                dedup_changed = true;
                let stamped = self.stamp.is_some();
                let n = self.snap.inbox.len();
                if stamped {
                    for en in &mut self.snap.inbox[n - self.pending..] {
                        en.tag = Some(version);
                    }
                }
                let (floor0, undated0) = (self.snap.floor_ms, self.snap.undated);
                let keep = window.max(self.pending);
                if n > keep {
                    let evicted: Vec<Entry> = self.snap.inbox.drain(..n - keep).collect();
                    for en in evicted {
                        match en.t_ms {
                            Some(ms) => {
                                if self.snap.floor_ms.is_none_or(|f| ms > f) {
                                    self.snap.floor_ms = Some(ms);
                                }
                            }
                            None => self.snap.undated = true,
                        }
                        if let Some(tag) = en.tag {
                            self.snap.archived_tags.insert(en.id.clone(), tag);
                        }
                        self.snap.archived.insert(en.id.clone(), en.effective_hash().map(str::to_string));
                        let doc = self.archive_doc(&en, horizon_us, skew_us);
                        let b = PyBytes::new(py, &doc);
                        archive.append(e.raw_document.bind(py).call1((b,))?)?;
                    }
                    self.index = None;
                }
                if self.snap.floor_ms != floor0 {
                    b::put_date(&mut set_dedup, b"inbox_archive_floor", self.snap.floor_ms.unwrap());
                }
                if self.snap.undated && !undated0 {
                    b::put_bool(&mut set_dedup, b"inbox_archive_undated", true);
                }
                let mut arr = Vec::new();
                let o = b::open(&mut arr);
                let n = self.snap.inbox.len();
                for (k, en) in self.snap.inbox[n - self.pending..].iter().enumerate() {
                    let mut kb = Vec::new();
                    b::index_name(&mut kb, k);
                    b::key(&mut arr, b::T_ARRAY, &kb);
                    let a = b::open(&mut arr);
                    b::put_str(&mut arr, b"0", en.id.as_bytes());
                    match en.t_ms {
                        Some(ms) => b::put_date(&mut arr, b"1", ms),
                        None => b::put_null(&mut arr, b"1"),
                    }
                    match &en.hash {
                        Some(h) => b::put_str(&mut arr, b"2", h.as_bytes()),
                        None => b::put_null(&mut arr, b"2"),
                    }
                    if let Some(tag) = en.tag {
                        b::put_int(&mut arr, b"3", tag);
                    }
                    b::end(&mut arr, a);
                }
                b::end(&mut arr, o);
                inbox_push = Some((arr, -(window.max(self.pending) as i64)));
            }
            Dedup::High { .. } if !self.hw_changed.is_empty() => {
                dedup_changed = true;
                for k in &self.hw_changed {
                    hw_elems.push((k.clone(), self.snap.hw[k]));
                }
            }
            _ => {}
        }
        // The run stamp (aggregates.dedup.runs.stamped_changes).
        let mut run_elem: Option<Vec<u8>> = None; // the `_run` element: null or the stamp
        if dedup_changed && (self.snap.run.is_some() || self.stamp.is_some()) {
            match &self.stamp {
                None => {
                    let run = self.snap.run.as_mut().unwrap();
                    if run.stored_id.is_some() {
                        run.stored_id = None;
                        run.segments.clear();
                        let mut el = Vec::new();
                        b::put_null(&mut el, b"_run");
                        run_elem = Some(el);
                    }
                }
                Some((rid, attempt_label)) => {
                    let own = self.own_run();
                    let mut segments = if own {
                        self.snap.run.as_ref().unwrap().segments.clone()
                    } else {
                        Vec::new()
                    };
                    if segments.last().is_none_or(|s| s.a != *attempt_label) {
                        segments.push(Segment { a: attempt_label.clone(), v: version, hw: None, x: None });
                    }
                    if !self.before.is_empty() {
                        let seg = segments.last_mut().unwrap();
                        if seg.hw.is_none() && seg.x.is_some() {
                            return Ok(None); // the definition appends hw after x
                        }
                        let mut marks = seg.hw.clone().unwrap_or_default();
                        for (k, mark) in &self.before {
                            if !marks.iter().any(|(mk, _)| mk == k) {
                                marks.push((k.clone(), *mark));
                            }
                        }
                        seg.hw = Some(marks);
                    }
                    let mut el = Vec::new();
                    b::key(&mut el, b::T_DOC, b"_run");
                    let r = b::open(&mut el);
                    b::put_str(&mut el, b"id", rid.as_bytes());
                    b::key(&mut el, b::T_ARRAY, b"w");
                    let w = b::open(&mut el);
                    for (k, s) in segments.iter().enumerate() {
                        let mut kb = Vec::new();
                        b::index_name(&mut kb, k);
                        b::key(&mut el, b::T_DOC, &kb);
                        let so = b::open(&mut el);
                        b::put_str(&mut el, b"a", s.a.as_bytes());
                        b::put_int(&mut el, b"v", s.v);
                        if let Some(marks) = &s.hw {
                            b::key(&mut el, b::T_ARRAY, b"hw");
                            let ho = b::open(&mut el);
                            for (j, (mk, mv)) in marks.iter().enumerate() {
                                let mut jb = Vec::new();
                                b::index_name(&mut jb, j);
                                b::key(&mut el, b::T_ARRAY, &jb);
                                let po = b::open(&mut el);
                                b::put_str(&mut el, b"0", mk.as_bytes());
                                b::put_int(&mut el, b"1", *mv);
                                b::end(&mut el, po);
                            }
                            b::end(&mut el, ho);
                        }
                        if let Some(xs) = &s.x {
                            b::key(&mut el, b::T_ARRAY, b"x");
                            let xo = b::open(&mut el);
                            for (j, xv) in xs.iter().enumerate() {
                                let mut jb = Vec::new();
                                b::index_name(&mut jb, j);
                                b::put_str(&mut el, &jb, xv.as_bytes());
                            }
                            b::end(&mut el, xo);
                        }
                        b::end(&mut el, so);
                    }
                    b::end(&mut el, w);
                    b::end(&mut el, r);
                    run_elem = Some(el);
                    self.snap.run = Some(Run { stored_id: Some(rid.clone()), segments });
                }
            }
        }
        // -- the write
        let empty = !self.applied && !dedup_changed && self.entries.is_empty();
        let mut op: Option<Vec<u8>> = None;
        let insert = !self.snap.exists;
        if !empty {
            let mut buf = Vec::with_capacity(512);
            let doc = b::open(&mut buf);
            let spec = self.spec;
            if insert {
                b::put_str(&mut buf, b"_id", &self.snap.aid_b);
                b::put_int(&mut buf, b"_v", version);
                b::put_str(&mut buf, b"_type", &spec.name_b);
                b::put_int(&mut buf, b"_p", partition(&self.snap.aid_b));
                b::put_int(&mut buf, b"_lv", 1);
                if let Some(s) = &state_bson {
                    b::key(&mut buf, b::T_DOC, b"state");
                    buf.extend_from_slice(s);
                    b::put_int(&mut buf, b"_sv", spec.state_version);
                }
                if self.applied {
                    b::put_int(&mut buf, b"_seq", self.snap.seq);
                }
                if !hw_elems.is_empty() {
                    b::key(&mut buf, b::T_DOC, b"hw");
                    let h = b::open(&mut buf);
                    for (k, v) in &hw_elems {
                        b::put_int(&mut buf, k.as_bytes(), *v);
                    }
                    b::end(&mut buf, h);
                }
                buf.extend_from_slice(&set_dedup);
                if let Some(r) = &run_elem {
                    buf.extend_from_slice(r);
                }
                if !self.entries.is_empty() {
                    put_entries(&mut buf, b"outbox", &self.entries);
                }
                if let Some((arr, _)) = &inbox_push {
                    b::key(&mut buf, b::T_ARRAY, b"inbox");
                    buf.extend_from_slice(arr);
                }
            } else {
                b::key(&mut buf, b::T_DOC, b"$inc");
                let inc = b::open(&mut buf);
                b::put_int(&mut buf, b"_v", 1);
                b::end(&mut buf, inc);
                let has_set = state_bson.is_some() || self.applied || !hw_elems.is_empty()
                    || !set_dedup.is_empty() || run_elem.is_some();
                if has_set {
                    b::key(&mut buf, b::T_DOC, b"$set");
                    let s = b::open(&mut buf);
                    if let Some(st) = &state_bson {
                        b::key(&mut buf, b::T_DOC, b"state");
                        buf.extend_from_slice(st);
                        b::put_int(&mut buf, b"_sv", spec.state_version);
                    }
                    if self.applied {
                        b::put_int(&mut buf, b"_seq", self.snap.seq);
                    }
                    for (k, v) in &hw_elems {
                        let mut path = b"hw.".to_vec();
                        path.extend_from_slice(k.as_bytes());
                        b::put_int(&mut buf, &path, *v);
                    }
                    buf.extend_from_slice(&set_dedup);
                    if let Some(r) = &run_elem {
                        buf.extend_from_slice(r);
                    }
                    b::end(&mut buf, s);
                }
                if !self.entries.is_empty() || inbox_push.is_some() {
                    b::key(&mut buf, b::T_DOC, b"$push");
                    let p = b::open(&mut buf);
                    if !self.entries.is_empty() {
                        b::key(&mut buf, b::T_DOC, b"outbox");
                        let o = b::open(&mut buf);
                        put_entries(&mut buf, b"$each", &self.entries);
                        b::end(&mut buf, o);
                    }
                    if let Some((arr, slice)) = &inbox_push {
                        b::key(&mut buf, b::T_DOC, b"inbox");
                        let o = b::open(&mut buf);
                        b::key(&mut buf, b::T_ARRAY, b"$each");
                        buf.extend_from_slice(arr);
                        b::put_int(&mut buf, b"$slice", *slice);
                        b::end(&mut buf, o);
                    }
                    b::end(&mut buf, p);
                }
            }
            b::end(&mut buf, doc);
            op = Some(buf);
        }
        // -- outcomes
        let outcomes = PyList::empty(py);
        let aattempt = attempt.into_pyobject(py)?;
        let false_ = false.into_pyobject(py)?;
        for d in &self.done {
            let o = e.outcome.alloc(py)?;
            let m = d.msg.bind(py);
            // SAFETY: `o` is new with every slot NULL; `m` is a Message.
            unsafe {
                let mp = m.as_ptr();
                e.outcome.set(&o, 0, &Bound::from_borrowed_ptr(py, e.message.get(mp, M_ID)));
                e.outcome.set(&o, 1, &Bound::from_borrowed_ptr(py, e.message.get(mp, M_ATYPE)));
                e.outcome.set(&o, 2, &Bound::from_borrowed_ptr(py, e.message.get(mp, M_AID)));
                e.outcome.set(&o, 3, if d.applied { e.s_applied.bind(py).as_any() } else { e.s_duplicate.bind(py).as_any() });
                e.outcome.set(&o, 4, &py.None().into_bound(py));
                e.outcome.set(&o, 5, &py.None().into_bound(py));
                if d.emitted.is_empty() {
                    e.outcome.set(&o, 6, e.empty_tuple.bind(py).as_any());
                } else {
                    let t = PyTuple::new(py, d.emitted.iter().map(|s| PyString::new(py, s)))?;
                    e.outcome.set(&o, 6, t.as_any());
                }
                e.outcome.set(&o, 7, aattempt.as_any());
                e.outcome.set(&o, 8, false_.as_any());
            }
            outcomes.append(o)?;
        }
        // -- the snapshot after the write
        if self.applied {
            let st = self.state.take().unwrap();
            self.snap.state_obj = Some(st.obj);
            self.snap.state_raw = None;
            self.snap.state_bytes = state_bson.as_ref().map_or(0, |s| if s.len() > 5 { s.len() as i64 } else { 0 });
        }
        let (op_obj, op_bytes) = match op {
            None => (None, None),
            Some(bytes) => {
                let b = PyBytes::new(py, &bytes);
                let raw = e.raw_document.bind(py).call1((&b,))?;
                let obj = if insert {
                    e.insert_one.bind(py).call1((raw,))?
                } else {
                    let filter = PyDict::new(py);
                    filter.set_item(e.s_id.bind(py), self.snap.aid.bind(py))?;
                    filter.set_item(e.s_v.bind(py), self.snap.version)?;
                    let kw = PyDict::new(py);
                    kw.set_item(e.s_upsert.bind(py), true)?;
                    e.update_one.bind(py).call((filter, raw), Some(&kw))?
                };
                (Some(obj.unbind()), Some(b.unbind()))
            }
        };
        Ok(Some(NativeFold {
            op: op_obj,
            op_bytes,
            op_insert: insert,
            outcomes: outcomes.unbind(),
            archive: archive.unbind(),
            snapshot: None,
            snap: Some(self.snap),
            empty_list: PyList::empty(py).unbind(),
        }))
    }
}

pub(crate) fn digits(i: usize) -> i64 {
    let mut n = 1;
    let mut v = i / 10;
    while v > 0 {
        n += 1;
        v /= 10;
    }
    n
}

/// The entries as an array element `name`.
pub(crate) fn put_entries(buf: &mut Vec<u8>, name: &[u8], entries: &[Vec<u8>]) {
    b::key(buf, b::T_ARRAY, name);
    let a = b::open(buf);
    for (i, d) in entries.iter().enumerate() {
        let mut kb = Vec::new();
        b::index_name(&mut kb, i);
        b::key(buf, b::T_DOC, &kb);
        buf.extend_from_slice(d);
    }
    b::end(buf, a);
}

/// `_p`: the first 8 bytes of SHA-256 of the id, big-endian, modulo 256 (the 8th byte).
pub(crate) fn partition(aid: &[u8]) -> i64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(aid);
    d[7] as i64
}

/// A Python value as element `name`.
///
/// Safety: GIL held.
pub(crate) unsafe fn put_py(
    py: Python<'_>,
    buf: &mut Vec<u8>,
    name: &[u8],
    o: *mut ffi::PyObject,
    utc: *mut ffi::PyObject,
    fb: &Bound<'_, PyAny>,
) -> PyResult<()> {
    match b::put_value(py, buf, name, o, utc, fb, 0) {
        Ok(()) => Ok(()),
        Err(b::Unencoded::Error) => Err(PyErr::fetch(py)),
        Err(b::Unencoded::Foreign) => Err(PyRuntimeError::new_err("unencodable value")),
    }
}

/// A dict as a document's bytes (no element name); false when it cannot be written.
pub(crate) unsafe fn put_doc(
    py: Python<'_>,
    buf: &mut Vec<u8>,
    o: *mut ffi::PyObject,
    utc: *mut ffi::PyObject,
    fb: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    if !b::is_dict(o) {
        return Ok(false);
    }
    match b::put_dict_body(py, buf, o, utc, fb, 0) {
        Ok(ok) => Ok(ok),
        Err(_) => {
            ffi::PyErr_Clear();
            Ok(false)
        }
    }
}

/// A value of a scalar-field dataclass state that BSON stores as it is.
pub(crate) unsafe fn scalar_storable(v: *mut ffi::PyObject) -> bool {
    if b::is_str(v) {
        return b::utf8(v).is_some();
    }
    if b::is_int(v) {
        return b::int64(v).is_some();
    }
    true
}


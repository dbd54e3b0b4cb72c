//! What the batch fold knows of one aggregate document (`NativeSnap`): read from its BSON
//! as `aggregates.fold.document.snapshot_from_document` and
//! `aggregates.dedup.runstate.read_run` read it, or as the last native fold of it wrote it.
//! A document with anything this module does not read the same way is left to the
//! definition (`NativeSnap.read` returns None).

use std::collections::HashMap;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::bsonw::{self as b, Elem};
use crate::fold::{env, Dedup, TypeSpec, M_ID};
use crate::values::msg_time_ms;

#[derive(Clone)]
pub(crate) struct Entry {
    pub(crate) id: String,
    /// occurred_at in milliseconds (None: undated)
    pub(crate) t_ms: Option<i64>,
    /// The payload hash as stored (None: null; an empty one counts as none).
    pub(crate) hash: Option<String>,
    pub(crate) tag: Option<i64>,
}

impl Entry {
    pub(crate) fn effective_hash(&self) -> Option<&str> {
        self.hash.as_deref().filter(|h| !h.is_empty())
    }
}

#[derive(Clone)]
pub(crate) struct Segment {
    pub(crate) a: String,
    pub(crate) v: i64,
    pub(crate) hw: Option<Vec<(String, i64)>>,
    pub(crate) x: Option<Vec<String>>,
}

#[derive(Clone)]
pub(crate) struct Run {
    pub(crate) stored_id: Option<String>,
    pub(crate) segments: Vec<Segment>,
}

/// What the fold knows of one aggregate document: as read (from its BSON) or as the last
/// native fold of it wrote it.
#[pyclass(module = "_aggbox_native")]
pub struct NativeSnap {
    pub(crate) aid: Py<PyString>,
    pub(crate) aid_b: Vec<u8>,
    pub(crate) version: i64,
    pub(crate) seq: i64,
    pub(crate) outbox_count: usize,
    pub(crate) size_bytes: i64,
    /// The stored state's BSON size (0 for none or empty), and the state to load: the raw
    /// sub-document, or the object a previous fold ended with.
    pub(crate) state_bytes: i64,
    pub(crate) state_raw: Option<Vec<u8>>,
    pub(crate) state_obj: Option<Py<PyAny>>,
    pub(crate) inbox: Vec<Entry>,
    pub(crate) floor_ms: Option<i64>,
    pub(crate) undated: bool,
    pub(crate) hw: HashMap<String, i64>,
    pub(crate) archived: HashMap<String, Option<String>>,
    pub(crate) archived_tags: HashMap<String, i64>,
    pub(crate) archive_known: bool,
    pub(crate) lookup_floor_ms: Option<i64>,
    pub(crate) lookup_undated: bool,
    pub(crate) run: Option<Run>,
    /// Whether the document exists (version > 0).
    #[pyo3(get)]
    pub(crate) exists: bool,
}

#[pymethods]
impl NativeSnap {
    /// The snapshot of a missing document.
    #[staticmethod]
    fn missing(aid: Bound<'_, PyString>) -> PyResult<Self> {
        let aid_b = aid.to_str()?.as_bytes().to_vec();
        Ok(NativeSnap {
            aid: aid.unbind(),
            aid_b,
            version: 0,
            seq: 0,
            outbox_count: 0,
            size_bytes: 0,
            state_bytes: 0,
            state_raw: None,
            state_obj: None,
            inbox: Vec::new(),
            floor_ms: None,
            undated: false,
            hw: HashMap::new(),
            archived: HashMap::new(),
            archived_tags: HashMap::new(),
            archive_known: false,
            lookup_floor_ms: None,
            lookup_undated: false,
            run: None,
            exists: false,
        })
    }

    /// The snapshot of a stored document's BSON, or None when the fold cannot take it (a
    /// layout, state version, block, timer or field it leaves to the definition).
    #[staticmethod]
    fn read(aid: Bound<'_, PyString>, raw: &[u8], state_version: i64) -> PyResult<Option<Self>> {
        let mut s = NativeSnap::missing(aid)?;
        Ok(if s.parse(raw, state_version) { Some(s) } else { None })
    }

    #[getter]
    fn version(&self) -> i64 {
        self.version
    }

    /// The message ids of `messages[start:stop]` the inbox archive must be asked about
    /// (`aggregates.dedup.inbox.needs_archive`); empty when the record never archived one.
    fn lookup_ids<'py>(
        &self,
        py: Python<'py>,
        spec: &TypeSpec,
        messages: &Bound<'py, PyList>,
        start: usize,
        stop: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let always = match spec.dedup {
            Dedup::Inbox { always, .. } => always,
            _ => return Ok(out),
        };
        if self.floor_ms.is_none() && !self.undated {
            return Ok(out);
        }
        let e = env()?;
        let utc = e.utc.as_ptr();
        for i in start..stop.min(messages.len()) {
            let m = messages.get_item(i)?;
            // SAFETY: checked to be a Message; GIL held.
            unsafe {
                if !e.message.is(m.as_ptr()) {
                    continue;
                }
                let t = msg_time_ms(&e.message, m.as_ptr(), utc);
                let t = match t {
                    Some(t) => t,
                    None => return Err(PyRuntimeError::new_err("occurred_at not UTC")),
                };
                if !always && !could_be_archived(t, self.floor_ms, self.undated) {
                    continue;
                }
                let id = e.message.get(m.as_ptr(), M_ID);
                let ids = b::utf8(id).unwrap_or_default();
                let ids = std::str::from_utf8(ids).unwrap_or_default();
                if !self.inbox.iter().any(|x| x.id == ids) {
                    out.append(Bound::from_borrowed_ptr(py, id))?;
                }
            }
        }
        Ok(out)
    }

    /// Records the archive's answer (`DedupRecord.looked_up`): message id → payload hash,
    /// and the write versions of those stored with one.
    #[pyo3(signature = (found, tags=None))]
    fn looked_up(
        &mut self,
        found: &Bound<'_, PyDict>,
        tags: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        for (k, v) in found.iter() {
            let h: Option<String> = if v.is_none() { None } else { Some(v.extract()?) };
            self.archived.insert(k.extract()?, h);
        }
        if let Some(tags) = tags {
            for (k, v) in tags.iter() {
                self.archived_tags.insert(k.extract()?, v.extract()?);
            }
        }
        self.lookup_floor_ms = self.floor_ms;
        self.lookup_undated = self.undated;
        self.archive_known = true;
        Ok(())
    }
}

pub(crate) fn could_be_archived(t: Option<i64>, floor: Option<i64>, undated: bool) -> bool {
    match t {
        None => undated,
        Some(t) => matches!(floor, Some(f) if t <= f),
    }
}

impl NativeSnap {
    pub(crate) fn copy(&self, py: Python<'_>) -> NativeSnap {
        NativeSnap {
            aid: self.aid.clone_ref(py),
            aid_b: self.aid_b.clone(),
            version: self.version,
            seq: self.seq,
            outbox_count: self.outbox_count,
            size_bytes: self.size_bytes,
            state_bytes: self.state_bytes,
            state_raw: self.state_raw.clone(),
            state_obj: self.state_obj.as_ref().map(|o| o.clone_ref(py)),
            inbox: self.inbox.clone(),
            floor_ms: self.floor_ms,
            undated: self.undated,
            hw: self.hw.clone(),
            archived: self.archived.clone(),
            archived_tags: self.archived_tags.clone(),
            archive_known: self.archive_known,
            lookup_floor_ms: self.lookup_floor_ms,
            lookup_undated: self.lookup_undated,
            run: self.run.clone(),
            exists: self.exists,
        }
    }

    /// Reads a stored document; false when the fold must leave it to the definition.
    fn parse(&mut self, raw: &[u8], state_version: i64) -> bool {
        let elems = match b::elements(raw) {
            Some(e) => e,
            None => return false,
        };
        self.size_bytes = raw.len() as i64;
        let mut version = None;
        let mut sv = 1;
        for el in &elems {
            match el.name {
                b"_v" => version = el.int(),
                b"_lv" => {
                    if el.int32() != Some(1) {
                        return false;
                    }
                }
                b"_sv" => match el.int32() {
                    Some(v) => sv = v,
                    None => return false,
                },
                b"_blocked" => {
                    if !el.is_null() {
                        return false;
                    }
                }
                b"_seq" => match el.int() {
                    Some(v) => self.seq = v,
                    None => return false,
                },
                b"outbox" => match el.doc().and_then(b::elements) {
                    Some(items) if el.t == b::T_ARRAY => self.outbox_count = items.len(),
                    _ => {
                        if !el.is_null() {
                            return false;
                        }
                    }
                },
                b"state" => {
                    if el.t == b::T_DOC {
                        if el.value.len() > 5 {
                            self.state_bytes = el.value.len() as i64;
                        }
                        self.state_raw = Some(el.value.to_vec());
                    } else if !el.is_null() {
                        return false;
                    }
                }
                b"inbox" => {
                    if !el.is_null() && !self.read_inbox(el) {
                        return false;
                    }
                }
                b"inbox_archive_floor" => {
                    if let Some(ms) = el.date() {
                        self.floor_ms = Some(ms);
                    } else if !el.is_null() {
                        return false;
                    }
                }
                b"inbox_archive_undated" => {
                    if el.t != b::T_BOOL {
                        if !el.is_null() {
                            return false;
                        }
                    } else {
                        self.undated = el.value[0] != 0;
                    }
                }
                b"hw" => {
                    if !el.is_null() && !self.read_hw(el) {
                        return false;
                    }
                }
                b"_run" => {
                    if !self.read_run(el) {
                        return false;
                    }
                }
                // Timers are left alone by a slice that schedules none; `_tseq` likewise.
                _ => {}
            }
        }
        match version {
            Some(v) if v > 0 => self.version = v,
            _ => return false,
        }
        self.exists = true;
        sv == state_version
    }

    fn read_inbox(&mut self, el: &Elem<'_>) -> bool {
        let items = match el.doc().and_then(b::elements) {
            Some(i) if el.t == b::T_ARRAY => i,
            _ => return false,
        };
        for it in items {
            let parts = match it.doc().and_then(b::elements) {
                Some(p) if it.t == b::T_ARRAY && (3..=4).contains(&p.len()) => p,
                _ => return false,
            };
            let id = match parts[0].string() {
                Some(s) => String::from_utf8_lossy(s).into_owned(),
                None => return false,
            };
            let t_ms = if parts[1].is_null() {
                None
            } else {
                match parts[1].date() {
                    Some(ms) => Some(ms),
                    None => return false,
                }
            };
            let hash = if parts[2].is_null() {
                None
            } else {
                match parts[2].string() {
                    Some(s) => Some(String::from_utf8_lossy(s).into_owned()),
                    None => return false,
                }
            };
            let tag = if parts.len() == 4 {
                match parts[3].int32() {
                    Some(v) => Some(v),
                    None => return false,
                }
            } else {
                None
            };
            self.inbox.push(Entry { id, t_ms, hash, tag });
        }
        true
    }

    fn read_hw(&mut self, el: &Elem<'_>) -> bool {
        let items = match el.doc().and_then(b::elements) {
            Some(i) if el.t == b::T_DOC => i,
            _ => return false,
        };
        for it in items {
            let k = match std::str::from_utf8(it.name) {
                Ok(k) => k.to_string(),
                Err(_) => return false,
            };
            match it.int() {
                Some(v) => {
                    self.hw.insert(k, v);
                }
                None => return false,
            }
        }
        true
    }

    /// `_run` as `aggregates.dedup.runstate.read_run` reads it (segments without `a` or an
    /// int `v` dropped); anything it would read differently is left to the definition.
    fn read_run(&mut self, el: &Elem<'_>) -> bool {
        if el.is_null() {
            self.run = Some(Run { stored_id: None, segments: Vec::new() });
            return true;
        }
        let fields = match el.doc().and_then(b::elements) {
            Some(f) if el.t == b::T_DOC => f,
            _ => return false,
        };
        let mut id = None;
        let mut segments = Vec::new();
        for f in &fields {
            match f.name {
                b"id" => match f.string() {
                    Some(s) => id = Some(String::from_utf8_lossy(s).into_owned()),
                    None => return false,
                },
                b"w" => {
                    let segs = match f.doc().and_then(b::elements) {
                        Some(s) if f.t == b::T_ARRAY => s,
                        _ => return false,
                    };
                    for s in segs {
                        match read_segment(&s) {
                            Some(Some(seg)) => segments.push(seg),
                            Some(None) => {}
                            None => return false,
                        }
                    }
                }
                _ => return false,
            }
        }
        match id {
            Some(id) => self.run = Some(Run { stored_id: Some(id), segments }),
            None => return false,
        }
        true
    }

    pub(crate) fn index(&self) -> HashMap<&str, Option<&str>> {
        self.inbox.iter().map(|e| (e.id.as_str(), e.effective_hash())).collect()
    }
}

/// A stored run segment: Some(None) when `read_run` drops it, None when it is not what
/// aggbox writes (left to the definition).
fn read_segment(s: &Elem<'_>) -> Option<Option<Segment>> {
    let f = s.doc().and_then(b::elements)?;
    if s.t != b::T_DOC {
        return None;
    }
    let names: Vec<&[u8]> = f.iter().map(|e| e.name).collect();
    let order_ok = matches!(
        names.as_slice(),
        [b"a", b"v"] | [b"a", b"v", b"hw"] | [b"a", b"v", b"x"] | [b"a", b"v", b"hw", b"x"]
    );
    if !order_ok {
        return None;
    }
    let a = String::from_utf8_lossy(f[0].string()?).into_owned();
    let v = match f[1].int32() {
        Some(v) => v,
        None => return Some(None), // not an int: read_run drops it
    };
    let mut seg = Segment { a, v, hw: None, x: None };
    for e in &f[2..] {
        let items = b::elements(e.doc()?)?;
        if e.t != b::T_ARRAY {
            return None;
        }
        if e.name == b"hw" {
            let mut marks = Vec::new();
            for p in items {
                let pair = b::elements(p.doc()?)?;
                if p.t != b::T_ARRAY || pair.len() != 2 {
                    return None;
                }
                marks.push((String::from_utf8_lossy(pair[0].string()?).into_owned(), pair[1].int32()?));
            }
            seg.hw = Some(marks);
        } else {
            let mut xs = Vec::new();
            for x in items {
                xs.push(String::from_utf8_lossy(x.string()?).into_owned());
            }
            seg.x = Some(xs);
        }
    }
    Some(Some(seg))
}


//! The batch fold (docs/design.md "The hot path", "The batch fold"): one aggregate's slice of
//! messages folded in native code — the dedup decisions and records, the handler calls (the
//! only Python per message besides a typed payload's validation), the outbox entries and
//! their ids, the state's storability, the size budget, the run stamp — and the conditional
//! write built as BSON bytes (an update of the version read, or the insert of a new
//! document), the outcomes built as `Outcome` objects.
//!
//! It covers the common path only. Whatever else a slice meets — a message that is not
//! applied or a duplicate (a dead letter, a parked message, an earlier attempt's claim), a
//! handler that raises, timers, upcasts, an unusual emit or state, a document it does not
//! understand, a budget exceeded — makes it give the slice back (`None`): the caller folds
//! it with `aggregates.fold.fold`, the definition, from the same snapshot. Handlers are pure,
//! so calling one again there is what the fold's strict pass does anyway. What this module
//! writes is byte for byte what the definition writes (tests/aggregates/test_native_fold.py).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::bsonw::{self as b, Elem};
use crate::slots::{dict_get, Slots};

// ---------------------------------------------------------------- environment

/// The Python classes and functions the fold needs, registered once by
/// `aggregates.store.nativefold`.
pub struct Env {
    message: Slots,
    emit: Slots,
    source: Slots,
    outcome: Slots,
    aggregate_ref: Py<PyType>,
    utc: Py<PyAny>,
    /// `bson.encode({"v": value}, codec_options=...)` for values not encoded here.
    encode_value: Py<PyAny>,
    /// `aggregates.core.tracecontext.trace_headers`.
    trace_headers: Py<PyAny>,
    /// `aggregates.domain.aggregate.dump_payload_checked`.
    dump_payload: Py<PyAny>,
    /// `aggregates.codec.check.scalar_dataclass_fields`, and what it said per class.
    scalar_fields: Py<PyAny>,
    payload_fields: Mutex<HashMap<usize, PayloadFields>>,
    /// `"aggbox-kind"` and `"event"`.
    kind_header: Py<PyString>,
    kind_event: Py<PyString>,
    s_applied: Py<PyString>,
    s_duplicate: Py<PyString>,
    empty_tuple: Py<PyTuple>,
    namespace: [u8; 16],
    /// pymongo's `InsertOne`, `UpdateOne` and bson's `RawBSONDocument`: the writes as sent.
    insert_one: Py<PyAny>,
    update_one: Py<PyAny>,
    raw_document: Py<PyAny>,
    s_id: Py<PyString>,
    s_v: Py<PyString>,
    s_upsert: Py<PyString>,
}

/// A payload class (kept alive) and its scalar fields, when it has only such fields.
type PayloadFields = (Py<PyAny>, Option<Vec<(Py<PyString>, Vec<usize>)>>);

static ENV: OnceLock<Env> = OnceLock::new();

fn env() -> PyResult<&'static Env> {
    ENV.get().ok_or_else(|| PyRuntimeError::new_err("_aggbox_native.fold_init was not called"))
}

const MSG_FIELDS: [&str; 11] = [
    "message_id", "type", "aggregate_type", "aggregate_id", "payload", "occurred_at",
    "source", "correlation_id", "causation_id", "headers", "schema_version",
];
const M_ID: usize = 0;
const M_TYPE: usize = 1;
const M_ATYPE: usize = 2;
const M_AID: usize = 3;
const M_PAYLOAD: usize = 4;
const M_AT: usize = 5;
const M_SOURCE: usize = 6;
const M_CORR: usize = 7;
const M_HEADERS: usize = 9;
const M_SV: usize = 10;
const EMIT_FIELDS: [&str; 7] = ["type", "payload", "to", "topic", "key", "headers", "schema_version"];
const OUTCOME_FIELDS: [&str; 9] = [
    "message_id", "aggregate_type", "aggregate_id", "outcome", "reason", "detail",
    "emitted_ids", "attempt", "from_parked",
];

#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn fold_init(
    py: Python<'_>,
    message: &Bound<'_, PyType>,
    emit: &Bound<'_, PyType>,
    source: &Bound<'_, PyType>,
    outcome: &Bound<'_, PyType>,
    aggregate_ref: &Bound<'_, PyType>,
    utc: Py<PyAny>,
    encode_value: Py<PyAny>,
    trace_headers: Py<PyAny>,
    dump_payload: Py<PyAny>,
    scalar_fields: Py<PyAny>,
    namespace: &Bound<'_, PyBytes>,
    insert_one: Py<PyAny>,
    update_one: Py<PyAny>,
    raw_document: Py<PyAny>,
) -> PyResult<()> {
    // SAFETY: imports the datetime C API once (idempotent), GIL held.
    unsafe {
        if ffi::PyDateTimeAPI().is_null() {
            ffi::PyDateTime_IMPORT();
        }
    }
    let ns: [u8; 16] = namespace
        .as_bytes()
        .try_into()
        .map_err(|_| PyRuntimeError::new_err("the namespace is 16 bytes"))?;
    let e = Env {
        message: Slots::of(message, &MSG_FIELDS)?,
        emit: Slots::of(emit, &EMIT_FIELDS)?,
        source: Slots::of(source, &["type", "id", "seq"])?,
        outcome: Slots::of(outcome, &OUTCOME_FIELDS)?,
        aggregate_ref: aggregate_ref.clone().unbind(),
        utc,
        encode_value,
        trace_headers,
        dump_payload,
        scalar_fields,
        payload_fields: Mutex::new(HashMap::new()),
        kind_header: PyString::intern(py, "aggbox-kind").unbind(),
        kind_event: PyString::intern(py, "event").unbind(),
        s_applied: PyString::intern(py, "applied").unbind(),
        s_duplicate: PyString::intern(py, "duplicate").unbind(),
        empty_tuple: PyTuple::empty(py).unbind(),
        namespace: ns,
        insert_one,
        update_one,
        raw_document,
        s_id: PyString::intern(py, "_id").unbind(),
        s_v: PyString::intern(py, "_v").unbind(),
        s_upsert: PyString::intern(py, "upsert").unbind(),
    };
    let _ = ENV.set(e);
    Ok(())
}

// ---------------------------------------------------------------- the aggregate type

#[derive(Clone, Copy, PartialEq)]
enum Dedup {
    None,
    Inbox { window: usize, horizon_us: i64, skew_us: i64, always: bool },
    High { contiguous: bool, max_sources: usize },
}

/// What the fold needs of one aggregate type (built once per type by the glue).
#[pyclass(frozen, module = "_aggbox_native")]
pub struct TypeSpec {
    name: Py<PyString>,
    name_b: Vec<u8>,
    dedup: Dedup,
    max_outbox: usize,
    topic: Option<Py<PyAny>>,
    state_version: i64,
    /// message type → (function, typed payload parser or None)
    handlers: Py<PyDict>,
    /// `atype.load_state`, `codec.dump_checked`, `codec._loaded` (a ContextVar).
    load_state: Py<PyAny>,
    dump_checked: Py<PyAny>,
    loaded: Py<PyAny>,
    /// A scalar-field dataclass state: its class and (field name, allowed exact types).
    fast_state: Option<(Py<PyAny>, Vec<(Py<PyString>, Vec<usize>)>)>,
    plain_dict: bool,
}

#[pymethods]
impl TypeSpec {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, dedup_kind, window, horizon_us, skew_us, lookup_always,
                        contiguous, max_sources, max_outbox, topic, state_version, handlers,
                        load_state, dump_checked, loaded, fast_state, plain_dict))]
    fn new(
        name: Bound<'_, PyString>,
        dedup_kind: &str,
        window: usize,
        horizon_us: i64,
        skew_us: i64,
        lookup_always: bool,
        contiguous: bool,
        max_sources: usize,
        max_outbox: usize,
        topic: Option<Py<PyAny>>,
        state_version: i64,
        handlers: Py<PyDict>,
        load_state: Py<PyAny>,
        dump_checked: Py<PyAny>,
        loaded: Py<PyAny>,
        fast_state: Option<(Py<PyAny>, Vec<(Py<PyString>, Vec<Bound<'_, PyType>>)>)>,
        plain_dict: bool,
    ) -> PyResult<Self> {
        let dedup = match dedup_kind {
            "none" => Dedup::None,
            "inbox" => Dedup::Inbox { window, horizon_us, skew_us, always: lookup_always },
            "high-water" => Dedup::High { contiguous, max_sources },
            _ => return Err(PyRuntimeError::new_err(format!("unknown dedup kind {dedup_kind}"))),
        };
        let name_b = name.to_str()?.as_bytes().to_vec();
        Ok(TypeSpec {
            name: name.unbind(),
            name_b,
            dedup,
            max_outbox,
            topic,
            state_version,
            handlers,
            load_state,
            dump_checked,
            loaded,
            fast_state: fast_state.map(|(cls, fields)| {
                (
                    cls,
                    fields
                        .into_iter()
                        .map(|(n, ts)| (n, ts.iter().map(|t| t.as_ptr() as usize).collect()))
                        .collect(),
                )
            }),
            plain_dict,
        })
    }
}

// ---------------------------------------------------------------- the snapshot

#[derive(Clone)]
struct Entry {
    id: String,
    /// occurred_at in milliseconds (None: undated)
    t_ms: Option<i64>,
    /// The payload hash as stored (None: null; an empty one counts as none).
    hash: Option<String>,
    tag: Option<i64>,
}

impl Entry {
    fn effective_hash(&self) -> Option<&str> {
        self.hash.as_deref().filter(|h| !h.is_empty())
    }
}

#[derive(Clone)]
struct Segment {
    a: String,
    v: i64,
    hw: Option<Vec<(String, i64)>>,
    x: Option<Vec<String>>,
}

#[derive(Clone)]
struct Run {
    stored_id: Option<String>,
    segments: Vec<Segment>,
}

/// What the fold knows of one aggregate document: as read (from its BSON) or as the last
/// native fold of it wrote it.
#[pyclass(module = "_aggbox_native")]
pub struct NativeSnap {
    aid: Py<PyString>,
    aid_b: Vec<u8>,
    version: i64,
    seq: i64,
    outbox_count: usize,
    size_bytes: i64,
    /// The stored state's BSON size (0 for none or empty), and the state to load: the raw
    /// sub-document, or the object a previous fold ended with.
    state_bytes: i64,
    state_raw: Option<Vec<u8>>,
    state_obj: Option<Py<PyAny>>,
    inbox: Vec<Entry>,
    floor_ms: Option<i64>,
    undated: bool,
    hw: HashMap<String, i64>,
    archived: HashMap<String, Option<String>>,
    archived_tags: HashMap<String, i64>,
    archive_known: bool,
    lookup_floor_ms: Option<i64>,
    lookup_undated: bool,
    run: Option<Run>,
    /// Whether the document exists (version > 0).
    #[pyo3(get)]
    exists: bool,
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

fn could_be_archived(t: Option<i64>, floor: Option<i64>, undated: bool) -> bool {
    match t {
        None => undated,
        Some(t) => matches!(floor, Some(f) if t <= f),
    }
}

impl NativeSnap {
    fn copy(&self, py: Python<'_>) -> NativeSnap {
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

    fn index(&self) -> HashMap<&str, Option<&str>> {
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

// ---------------------------------------------------------------- helpers

/// occurred_at of a Message in milliseconds: Some(None) undated, None when it is not a
/// datetime this module reads (left to the definition).
///
/// Safety: `m` is a Message, GIL held.
unsafe fn msg_time_ms(slots: &Slots, m: *mut ffi::PyObject, utc: *mut ffi::PyObject) -> Option<Option<i64>> {
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
unsafe fn storable(o: *mut ffi::PyObject) -> Option<&'static [u8]> {
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
fn hw_key(t: &[u8], id: &[u8]) -> String {
    let mut out = Vec::with_capacity(t.len() + id.len() + 1);
    escape_field(&mut out, t);
    out.push(b'/');
    escape_field(&mut out, id);
    String::from_utf8(out).expect("escaped UTF-8")
}

fn escape_field(out: &mut Vec<u8>, s: &[u8]) {
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
unsafe fn plain_json(o: *mut ffi::PyObject, depth: u32) -> bool {
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
            if !b::is_str(k) {
                return false;
            }
            match b::utf8(k) {
                Some(s) if s.first() != Some(&b'$') && !s.contains(&b'.') && !s.contains(&0) => {}
                _ => return false,
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

/// A dict state the codec stores as it is (`to_bson` of plain values copies them; keys
/// checked by `check_field_names`): like [`plain_json`], NaN and infinities allowed.
unsafe fn plain_state(o: *mut ffi::PyObject, depth: u32) -> bool {
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
            if !b::is_str(k) {
                return false;
            }
            match b::utf8(k) {
                Some(s) if s.first() != Some(&b'$') && !s.contains(&b'.') && !s.contains(&0) => {}
                _ => return false,
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

// ---------------------------------------------------------------- the fold

/// What one message of the slice came to.
struct Done {
    msg: Py<PyAny>,
    applied: bool,
    emitted: Vec<String>,
}

/// The state after a message: its object, and its document when the codec had to dump it
/// (None: a scalar-field dataclass or plain dict, encoded directly at the end).
struct StateNow {
    obj: Py<PyAny>,
    doc: Option<Py<PyAny>>,
}

/// The result of a native fold, read by the pass as it reads a `FoldResult`: the write,
/// the outcomes, the archive entries, and the snapshot once settled.
#[pyclass(module = "_aggbox_native")]
pub struct NativeFold {
    /// The write as pymongo sends it (`InsertOne`/`UpdateOne` of a `RawBSONDocument`), or
    /// None when the slice changes nothing.
    #[pyo3(get)]
    op: Option<Py<PyAny>>,
    /// The write's BSON (the new document, or the update document).
    #[pyo3(get)]
    op_bytes: Option<Py<PyBytes>>,
    #[pyo3(get)]
    op_insert: bool,
    #[pyo3(get)]
    outcomes: Py<PyList>,
    /// Inbox entries leaving the document with this write, as `[id, occurred_at, hash(,
    /// tag)]` lists (archived first, `aggregates.dedup.archive`).
    #[pyo3(get)]
    archive: Py<PyList>,
    /// The snapshot after the write, set by `settle()`.
    #[pyo3(get)]
    snapshot: Option<Py<NativeSnap>>,
    snap: Option<NativeSnap>,
    empty_list: Py<PyList>,
}

#[pymethods]
impl NativeFold {
    /// Whether the slice needs no write (`Changes.empty`).
    #[getter]
    fn empty(&self) -> bool {
        self.op.is_none()
    }

    /// The fold's changes, as the pass asks for them (`res.changes.empty`).
    #[getter]
    fn changes(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// A native fold has no dead letters, parked or released messages (it hands those
    /// slices back).
    #[getter]
    fn dead_letters(&self, py: Python<'_>) -> Py<PyList> {
        self.empty_list.clone_ref(py)
    }

    #[getter]
    fn parked(&self, py: Python<'_>) -> Py<PyList> {
        self.empty_list.clone_ref(py)
    }

    #[getter]
    fn released(&self, py: Python<'_>) -> Py<PyList> {
        self.empty_list.clone_ref(py)
    }

    /// Sets `snapshot`: the document once the write succeeded (or, without a write, as it
    /// was).
    fn settle(&mut self, py: Python<'_>) -> PyResult<()> {
        let mut s = self
            .snap
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("settle() called twice"))?;
        if self.op.is_some() {
            s.version += 1;
            s.exists = true;
        }
        self.snapshot = Some(Py::new(py, s)?);
        Ok(())
    }
}

/// What a pass's native folds share: the aggregate type, the writer's clock, budget, run
/// stamp, and how the collection decodes documents.
#[pyclass(frozen, module = "_aggbox_native")]
pub struct FoldCtx {
    spec: Py<TypeSpec>,
    now: Py<PyAny>,
    max_document_bytes: i64,
    stamp: Option<(String, String)>,
    codec_options: Py<PyAny>,
    /// The store's clock when it is not the writer's (the archive's expiry is put as far
    /// ahead of it: `aggregates.dedup.archive.InboxArchive.write`).
    store_now: Option<Py<PyAny>>,
}

#[pymethods]
impl FoldCtx {
    #[new]
    #[pyo3(signature = (spec, now, max_document_bytes, stamp, codec_options, store_now=None))]
    fn new(spec: Py<TypeSpec>, now: Py<PyAny>, max_document_bytes: i64,
           stamp: Option<(String, String)>, codec_options: Py<PyAny>,
           store_now: Option<Py<PyAny>>) -> Self {
        FoldCtx { spec, now, max_document_bytes, stamp, codec_options, store_now }
    }

    /// `fold_slice` with this context.
    fn fold<'py>(
        &self,
        py: Python<'py>,
        snap: &NativeSnap,
        messages: &Bound<'py, PyList>,
        start: usize,
        stop: usize,
        attempt: i64,
    ) -> PyResult<Option<NativeFold>> {
        let spec = self.spec.get();
        fold_slice(py, spec, snap, messages, start, stop, self.now.bind(py),
                   self.max_document_bytes, attempt, self.stamp.clone(),
                   Some(self.codec_options.bind(py)),
                   self.store_now.as_ref().map(|s| s.bind(py)))
    }
}

/// Folds `messages[start:stop]` of one aggregate on `snap` (see the module doc); None when
/// the slice must be folded by the definition.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (spec, snap, messages, start, stop, now, max_document_bytes, attempt,
                    stamp=None, codec_options_decode=None, store_now=None))]
pub fn fold_slice<'py>(
    py: Python<'py>,
    spec: &TypeSpec,
    snap: &NativeSnap,
    messages: &Bound<'py, PyList>,
    start: usize,
    stop: usize,
    now: &Bound<'py, PyAny>,
    max_document_bytes: i64,
    attempt: i64,
    stamp: Option<(String, String)>,
    codec_options_decode: Option<&Bound<'py, PyAny>>,
    store_now: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<NativeFold>> {
    let e = env()?;
    let mut f = Folder::new(py, e, spec, snap.copy(py), now, stamp)?;
    if let Some(sn) = store_now {
        // SAFETY: GIL held.
        f.store_now_us = match unsafe { b::datetime_us(sn.as_ptr(), e.utc.as_ptr()) } {
            Some(us) => Some(us),
            None => return Ok(None),
        };
    }
    if !f.load(py, codec_options_decode)? {
        return Ok(None);
    }
    let stop = stop.min(messages.len());
    for i in start..stop {
        let m = messages.get_item(i)?;
        if !f.step(py, &m)? {
            return Ok(None);
        }
    }
    f.finish(py, max_document_bytes, attempt)
}

struct Folder<'a> {
    e: &'a Env,
    spec: &'a TypeSpec,
    snap: NativeSnap,
    now_ms: i64,
    now_us: i64,
    stamp: Option<(String, String)>,
    state: Option<StateNow>,
    applied: bool,
    /// Inbox entries added by this fold (pending: never evicted by its own write).
    pending: usize,
    /// hw keys changed, in first-change order, and the marks before the first change.
    hw_changed: Vec<String>,
    before: Vec<(String, i64)>,
    done: Vec<Done>,
    /// This fold's outbox entries as BSON documents, in order.
    entries: Vec<Vec<u8>>,
    /// Message ids already recorded (inbox index, built on first use).
    index: Option<HashMap<String, Option<String>>>,
    store_now_us: Option<i64>,
}

impl<'a> Folder<'a> {
    fn new(
        _py: Python<'_>,
        e: &'a Env,
        spec: &'a TypeSpec,
        snap: NativeSnap,
        now: &Bound<'_, PyAny>,
        stamp: Option<(String, String)>,
    ) -> PyResult<Self> {
        // SAFETY: GIL held; `now` alive.
        let (now_ms, now_us) = unsafe {
            let utc = e.utc.as_ptr();
            match (b::datetime_ms(now.as_ptr(), utc), b::datetime_us(now.as_ptr(), utc)) {
                (Some(ms), Some(us)) => (ms, us),
                _ => return Err(PyRuntimeError::new_err("now must be a UTC datetime")),
            }
        };
        Ok(Folder {
            e,
            spec,
            snap,
            now_ms,
            now_us,
            stamp,
            state: None,
            applied: false,
            pending: 0,
            hw_changed: Vec::new(),
            before: Vec::new(),
            done: Vec::new(),
            entries: Vec::new(),
            index: None,
            store_now_us: None,
        })
    }

    /// The state object to fold on: the snapshot's, else `load_state` of its document.
    fn load(&mut self, py: Python<'_>, opts: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let obj = if let Some(o) = &self.snap.state_obj {
            o.clone_ref(py)
        } else {
            let doc: Bound<'_, PyAny> = match (&self.snap.state_raw, self.snap.exists) {
                (Some(raw), _) => {
                    let decode = py.import("bson")?.getattr("decode")?;
                    let kwargs = PyDict::new(py);
                    if let Some(o) = opts {
                        kwargs.set_item("codec_options", o)?;
                    }
                    decode.call((PyBytes::new(py, raw),), Some(&kwargs))?
                }
                (None, true) => PyDict::new(py).into_any(),
                (None, false) => py.None().into_bound(py),
            };
            match self.spec.load_state.bind(py).call1((doc, self.spec.state_version)) {
                Ok(o) => o.unbind(),
                Err(_) => return Ok(false), // invalid_state: the definition says why
            }
        };
        // Unknown stored fields are merged into every dump: left to the definition.
        if !self.spec.loaded.bind(py).call_method0("get")?.is_none() {
            return Ok(false);
        }
        self.state = Some(StateNow { obj, doc: None });
        Ok(true)
    }

    fn recorded(&mut self, id: &str) -> Option<Option<String>> {
        if self.index.is_none() {
            let idx: HashMap<String, Option<String>> = self
                .snap
                .index()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect();
            self.index = Some(idx);
        }
        if let Some(h) = self.index.as_ref().unwrap().get(id) {
            return Some(h.clone());
        }
        self.snap.archived.get(id).cloned()
    }

    fn own_run(&self) -> bool {
        match (&self.stamp, &self.snap.run) {
            (Some((run, _)), Some(r)) => r.stored_id.as_deref() == Some(run.as_str()),
            _ => false,
        }
    }

    /// A duplicate under the run stamp: false when an earlier attempt of this run applied
    /// it (the claim is the definition's to make).
    fn plain_duplicate(&self, tag: Option<i64>, hw: Option<(&str, i64)>) -> bool {
        if !self.own_run() {
            return true;
        }
        let run = self.snap.run.as_ref().unwrap();
        let attempt = &self.stamp.as_ref().unwrap().1;
        let label = match hw {
            None => {
                let v = match tag {
                    Some(v) => v,
                    None => return true,
                };
                let mut label = None;
                for seg in &run.segments {
                    if v >= seg.v {
                        label = Some(&seg.a);
                    }
                }
                label
            }
            Some((key, seq)) => {
                let mut label = None;
                for seg in &run.segments {
                    for (k, mark) in seg.hw.iter().flatten() {
                        if k == key && seq > *mark {
                            label = Some(&seg.a);
                        }
                    }
                }
                label
            }
        };
        match label {
            None => true,
            Some(l) => l == attempt,
        }
    }

    /// One message; false to give the slice back.
    fn step(&mut self, py: Python<'_>, m: &Bound<'_, PyAny>) -> PyResult<bool> {
        let e = self.e;
        let mp = m.as_ptr();
        // SAFETY: every slot read below is of an object checked to be a Message.
        unsafe {
            if !e.message.is(mp) {
                return Ok(false);
            }
            let headers = e.message.get(mp, M_HEADERS);
            if headers.is_null() || !b::is_dict(headers) {
                return Ok(false);
            }
            let has_headers = ffi::PyDict_Size(headers) > 0;
            if has_headers {
                let kind = dict_get(headers, e.kind_header.as_ptr());
                if !kind.is_null() {
                    if ffi::PyObject_RichCompareBool(kind, e.kind_event.as_ptr(), ffi::Py_EQ) != 0 {
                        return Ok(false); // an aggbox event: the definition's duplicate
                    }
                }
            }
            let idp = e.message.get(mp, M_ID);
            let id = match storable(idp) {
                Some(s) => std::str::from_utf8_unchecked(s).to_string(),
                None => return Ok(false),
            };
            let t_ms = match msg_time_ms(&e.message, mp, e.utc.as_ptr()) {
                Some(t) => t,
                None => return Ok(false),
            };
            // -- the dedup decision
            let mut phash = String::new();
            let mut hw_seq: Option<(String, i64)> = None;
            match self.spec.dedup {
                Dedup::None => {}
                Dedup::Inbox { horizon_us, .. } => {
                    let payload = e.message.get(mp, M_PAYLOAD);
                    let h = crate::hash_one(py, &Bound::from_borrowed_ptr(py, payload))?;
                    phash = h.extract()?;
                    if let Some(first) = self.recorded(&id) {
                        if matches!(&first, Some(f) if *f != phash) {
                            return Ok(false); // duplicate_with_different_payload
                        }
                        let tag = self
                            .snap
                            .inbox
                            .iter()
                            .find(|x| x.id == id)
                            .and_then(|x| x.tag)
                            .or_else(|| self.snap.archived_tags.get(&id).copied());
                        if !self.plain_duplicate(tag, None) {
                            return Ok(false);
                        }
                        self.duplicate(m);
                        return Ok(true);
                    }
                    if !self.snap.archive_known {
                        if self.snap.floor_ms.is_some() || self.snap.undated {
                            return Ok(false); // ArchiveNotConsulted: the definition raises
                        }
                    } else if could_be_archived(t_ms, self.snap.lookup_floor_ms, self.snap.lookup_undated) {
                        if let Some(t) = t_ms {
                            if t * 1000 < self.now_us - horizon_us {
                                return Ok(false); // beyond_dedup_horizon
                            }
                        }
                    }
                }
                Dedup::High { contiguous, max_sources } => {
                    let src = e.message.get(mp, M_SOURCE);
                    if src.is_null() || !e.source.is(src) {
                        return Ok(false); // missing_source
                    }
                    let (st, si, sq) = (e.source.get(src, 0), e.source.get(src, 1), e.source.get(src, 2));
                    let (st, si) = match (storable(st), storable(si)) {
                        (Some(a), Some(c)) => (a, c),
                        _ => return Ok(false),
                    };
                    let seq = match b::is_int(sq).then(|| b::int64(sq)).flatten() {
                        Some(s) => s,
                        None => return Ok(false),
                    };
                    let key = hw_key(st, si);
                    let hw = self.snap.hw.get(&key).copied();
                    let mark = hw.unwrap_or(0);
                    if seq <= mark {
                        if !self.plain_duplicate(None, Some((&key, seq))) {
                            return Ok(false);
                        }
                        self.duplicate(m);
                        return Ok(true);
                    }
                    if hw.is_none() && self.snap.hw.len() >= max_sources {
                        return Ok(false);
                    }
                    if contiguous && seq != mark + 1 {
                        return Ok(false);
                    }
                    hw_seq = Some((key, seq));
                }
            }
            if self.snap.outbox_count >= self.spec.max_outbox {
                return Ok(false); // outbox_full: parked
            }
            // -- the handler
            let mtype = e.message.get(mp, M_TYPE);
            let sv = e.message.get(mp, M_SV);
            if !b::is_int(sv) || b::int64(sv) != Some(1) {
                return Ok(false); // upcasting: the definition
            }
            let h = dict_get(self.spec.handlers.as_ptr(), mtype);
            if h.is_null() {
                return Ok(false); // unknown_message_type (or upcasters registered)
            }
            let h = Bound::from_borrowed_ptr(py, h);
            let (func, parse) = match h.cast::<PyTuple>() {
                Ok(t) if t.len() == 2 => (t.get_item(0)?, t.get_item(1)?),
                _ => return Ok(false),
            };
            let state = self.state.as_ref().expect("loaded").obj.clone_ref(py);
            let result = if parse.is_none() {
                func.call1((state, m))
            } else {
                let payload = Bound::from_borrowed_ptr(py, e.message.get(mp, M_PAYLOAD));
                match parse.call1((payload,)) {
                    Ok(payload) => func.call1((state, payload, m)),
                    Err(_) => return Ok(false), // invalid_payload
                }
            };
            let result = match result {
                Ok(r) => r,
                // handler_error, RetryableError, a deployment error: the definition runs
                // the handler again and decides.
                Err(_) => return Ok(false),
            };
            // -- the result: a state, or (state, [Emit, ...])
            let rp = result.as_ptr();
            let (new_state, emits): (Bound<'_, PyAny>, Option<Bound<'_, PyAny>>) = if b::is_tuple(rp) {
                let t = result.cast::<PyTuple>().unwrap();
                if t.len() != 2 {
                    return Ok(false);
                }
                let em = t.get_item(1)?;
                if !b::is_list(em.as_ptr()) {
                    return Ok(false);
                }
                (t.get_item(0)?, Some(em))
            } else if rp == ffi::Py_None() || ffi::PyTuple_Check(rp) != 0 {
                return Ok(false);
            } else {
                (result.clone(), None)
            };
            // -- the state: storable after this message (the definition dumps it per message)
            let doc = match self.state_check(py, &new_state)? {
                Some(d) => d,
                None => return Ok(false),
            };
            // -- the emits
            let mut entries: Vec<Vec<u8>> = Vec::new();
            let mut emitted: Vec<String> = Vec::new();
            if let Some(em) = &emits {
                let n = ffi::PyList_GET_SIZE(em.as_ptr()) as usize;
                if n > 0 {
                    if n > self.spec.max_outbox || self.snap.outbox_count + n > self.spec.max_outbox {
                        return Ok(false);
                    }
                    let trace = if has_headers {
                        let t = e.trace_headers.bind(py).call1((Bound::from_borrowed_ptr(py, headers),))?;
                        if t.is_none() {
                            None
                        } else {
                            Some(t)
                        }
                    } else {
                        None
                    };
                    for i in 0..n {
                        let x = ffi::PyList_GET_ITEM(em.as_ptr(), i as ffi::Py_ssize_t);
                        match self.entry(py, mp, &id, x, i, trace.as_ref())? {
                            Some((doc, eid)) => {
                                entries.push(doc);
                                emitted.push(eid);
                            }
                            None => return Ok(false),
                        }
                    }
                }
            }
            // -- commit
            self.state = Some(StateNow { obj: new_state.unbind(), doc });
            self.applied = true;
            match self.spec.dedup {
                Dedup::Inbox { .. } => {
                    let hash = if phash.is_empty() { None } else { Some(phash.clone()) };
                    if let Some(idx) = self.index.as_mut() {
                        idx.insert(id.clone(), hash.clone());
                    }
                    self.snap.inbox.push(Entry { id: id.clone(), t_ms, hash, tag: None });
                    self.pending += 1;
                }
                Dedup::High { .. } => {
                    let (key, seq) = hw_seq.expect("high-water decision");
                    let mark = self.snap.hw.get(&key).copied().unwrap_or(0);
                    if self.snap.run.is_some() || self.stamp.is_some() {
                        if !self.before.iter().any(|(k, _)| *k == key) {
                            self.before.push((key.clone(), mark));
                        }
                    }
                    self.snap.hw.insert(key.clone(), mark.max(seq));
                    if !self.hw_changed.contains(&key) {
                        self.hw_changed.push(key);
                    }
                }
                Dedup::None => {}
            }
            self.snap.seq += entries.len() as i64;
            self.snap.outbox_count += entries.len();
            self.entries.extend(entries);
            self.done.push(Done { msg: m.clone().unbind(), applied: true, emitted });
        }
        Ok(true)
    }

    fn duplicate(&mut self, m: &Bound<'_, PyAny>) {
        self.done.push(Done { msg: m.clone().unbind(), applied: false, emitted: Vec::new() });
    }

    /// Whether the new state is storable, as the definition's per-message dump decides:
    /// Some(None) proven without a dump, Some(Some(doc)) dumped by the codec, None: left to
    /// the definition.
    unsafe fn state_check(&self, py: Python<'_>, st: &Bound<'_, PyAny>) -> PyResult<Option<Option<Py<PyAny>>>> {
        let sp = st.as_ptr();
        if let Some((cls, fields)) = &self.spec.fast_state {
            if ffi::Py_TYPE(sp) as *mut ffi::PyObject == cls.as_ptr() {
                let mut ok = true;
                for (name, allowed) in fields {
                    let v = ffi::PyObject_GetAttr(sp, name.as_ptr());
                    if v.is_null() {
                        ffi::PyErr_Clear();
                        return Ok(None);
                    }
                    let t = ffi::Py_TYPE(v) as usize;
                    let good = allowed.contains(&t) && scalar_storable(v);
                    ffi::Py_DECREF(v);
                    if !good {
                        ok = false;
                        break;
                    }
                }
                if ok {
                    return Ok(Some(None));
                }
            }
        } else if self.spec.plain_dict && b::is_dict(sp) && plain_state(sp, 0) {
            return Ok(Some(None));
        }
        match self.spec.dump_checked.bind(py).call1((st,)) {
            Ok(doc) => Ok(Some(Some(doc.unbind()))),
            Err(_) => Ok(None),
        }
    }

    /// The outbox entry of emit `x` (#`i` of message `mp`): its BSON and id; None when the
    /// definition must decide it.
    #[allow(clippy::too_many_arguments)]
    unsafe fn entry(
        &mut self,
        py: Python<'_>,
        mp: *mut ffi::PyObject,
        cause: &str,
        x: *mut ffi::PyObject,
        i: usize,
        trace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<(Vec<u8>, String)>> {
        let e = self.e;
        if !e.emit.is(x) {
            return Ok(None); // Schedule, Cancel, a subclass, anything else
        }
        let etype = match storable(e.emit.get(x, 0)) {
            Some(s) => s,
            None => return Ok(None),
        };
        let payload = e.emit.get(x, 1);
        let to = e.emit.get(x, 2);
        let topic = e.emit.get(x, 3);
        let key = e.emit.get(x, 4);
        let eheaders = e.emit.get(x, 5);
        let esv = e.emit.get(x, 6);
        if payload.is_null() || to.is_null() || topic.is_null() || key.is_null() || eheaders.is_null() || esv.is_null() {
            return Ok(None);
        }
        // The payload: a plain dict as it is, a payload object of scalar fields read
        // directly, any other dumped by the definition's function (plain JSON only).
        let dumped: Bound<'_, PyAny>;
        let mut direct: Option<Vec<u8>> = None;
        let payload = if b::is_dict(payload) {
            if !plain_json(payload, 1) {
                return Ok(None);
            }
            payload
        } else if let Some(doc) = self.scalar_payload(py, payload)? {
            direct = Some(doc);
            payload
        } else {
            match e.dump_payload.bind(py).call1((Bound::from_borrowed_ptr(py, payload),)) {
                Ok(r) => {
                    dumped = r.get_item(0)?;
                    if !b::is_dict(dumped.as_ptr()) || !plain_json(dumped.as_ptr(), 1) {
                        return Ok(None);
                    }
                    dumped.as_ptr()
                }
                Err(_) => return Ok(None),
            }
        };
        // to: None or (type, id), two non-empty storable strings
        let target = if to == ffi::Py_None() {
            None
        } else {
            let tt = ffi::Py_TYPE(to) as *mut ffi::PyObject;
            if !(b::is_tuple(to) || tt == e.aggregate_ref.as_ptr()) || ffi::PyTuple_GET_SIZE(to) != 2 {
                return Ok(None);
            }
            match (storable(ffi::PyTuple_GET_ITEM(to, 0)), storable(ffi::PyTuple_GET_ITEM(to, 1))) {
                (Some(a), Some(c)) => Some((a, c)),
                _ => return Ok(None),
            }
        };
        let topic = if topic == ffi::Py_None() {
            None
        } else {
            match storable(topic) {
                Some(_) => Some(topic),
                None => return Ok(None),
            }
        };
        let key_b = if key == ffi::Py_None() {
            None
        } else {
            match storable(key) {
                Some(s) => Some(s),
                None => return Ok(None),
            }
        };
        if !b::is_dict(eheaders) || ffi::PyDict_Size(eheaders) != 0 {
            return Ok(None); // an emit's own headers: the definition checks them
        }
        let sv = if esv == ffi::Py_None() {
            None
        } else {
            match b::is_int(esv).then(|| b::int64(esv)).flatten() {
                Some(v) if (1..=i32::MAX as i64).contains(&v) => {
                    if v == 1 {
                        None
                    } else {
                        Some(v)
                    }
                }
                _ => return Ok(None),
            }
        };
        // The id: emitted_message_id(type, aggregate id, cause, i).
        let mut name = Vec::with_capacity(64);
        let tn = std::str::from_utf8_unchecked(&self.spec.name_b);
        let an = std::str::from_utf8_unchecked(&self.snap.aid_b);
        for s in [tn, an, cause] {
            crate::push_i64(&mut name, s.chars().count() as i64);
            name.push(b':');
            name.extend_from_slice(s.as_bytes());
        }
        crate::push_i64(&mut name, i as i64);
        let mut idb = Vec::with_capacity(36);
        crate::uuid5_str(&mut idb, &e.namespace, &name);
        let eid = String::from_utf8_unchecked(idb);
        // The entry, in the definition's field order.
        let utc = e.utc.as_ptr();
        let fb = e.encode_value.bind(py);
        let mut buf = Vec::with_capacity(256);
        let doc = b::open(&mut buf);
        b::put_str(&mut buf, b"id", eid.as_bytes());
        b::put_str(&mut buf, b"type", etype);
        match topic {
            Some(t) => b::put_str(&mut buf, b"topic", b::utf8(t).unwrap()),
            None => match &self.spec.topic {
                Some(t) => put_py(py, &mut buf, b"topic", t.as_ptr(), utc, fb)?,
                None => b::put_null(&mut buf, b"topic"),
            },
        }
        b::put_str(&mut buf, b"key", key_b.unwrap_or(&self.snap.aid_b));
        match &direct {
            Some(d) => {
                b::key(&mut buf, b::T_DOC, b"payload");
                buf.extend_from_slice(d);
            }
            None => put_py(py, &mut buf, b"payload", payload, utc, fb)?,
        }
        match trace {
            Some(t) => put_py(py, &mut buf, b"headers", t.as_ptr(), utc, fb)?,
            None => {
                b::key(&mut buf, b::T_DOC, b"headers");
                buf.extend_from_slice(&[5, 0, 0, 0, 0]);
            }
        }
        b::put_str(&mut buf, b"causation_id", cause.as_bytes());
        let corr = e.message.get(mp, M_CORR);
        match storable(corr) {
            Some(c) => b::put_str(&mut buf, b"correlation_id", c),
            None => {
                if !corr.is_null() && corr != ffi::Py_None() {
                    return Ok(None);
                }
                b::put_str(&mut buf, b"correlation_id", cause.as_bytes())
            }
        }
        b::key(&mut buf, b::T_DOC, b"source");
        let src = b::open(&mut buf);
        b::put_str(&mut buf, b"type", &self.spec.name_b);
        b::put_str(&mut buf, b"id", &self.snap.aid_b);
        b::put_int(&mut buf, b"seq", self.snap.seq + 1 + i as i64);
        b::end(&mut buf, src);
        b::put_date(&mut buf, b"created_at", self.now_ms);
        if let Some((tt, ti)) = target {
            b::key(&mut buf, b::T_DOC, b"target");
            let t = b::open(&mut buf);
            b::put_str(&mut buf, b"type", tt);
            b::put_str(&mut buf, b"id", ti);
            b::end(&mut buf, t);
        }
        if let Some(v) = sv {
            b::put_int(&mut buf, b"schema_version", v);
        }
        b::end(&mut buf, doc);
        Ok(Some((buf, eid)))
    }

    /// A payload object of a dataclass with scalar fields only, as the BSON document of its
    /// JSON form (what `dump_payload_checked` gives: the fields in order, as they are); None
    /// for any other object or value (the definition's function decides).
    unsafe fn scalar_payload(&self, py: Python<'_>, o: *mut ffi::PyObject) -> PyResult<Option<Vec<u8>>> {
        let e = self.e;
        let cls = ffi::Py_TYPE(o) as usize;
        let mut cache = e.payload_fields.lock().unwrap();
        if !cache.contains_key(&cls) {
            let c = Bound::from_borrowed_ptr(py, cls as *mut ffi::PyObject);
            let found = e.scalar_fields.bind(py).call1((&c,))?;
            let fields = if found.is_none() {
                None
            } else {
                let mut v = Vec::new();
                for item in found.try_iter()? {
                    let (name, allowed): (Bound<'_, PyString>, Vec<Bound<'_, PyAny>>) = item?.extract()?;
                    v.push((PyString::intern(py, name.to_str()?).unbind(),
                            allowed.iter().map(|t| t.as_ptr() as usize).collect()));
                }
                Some(v)
            };
            cache.insert(cls, (c.unbind(), fields));
        }
        let fields = match &cache.get(&cls).unwrap().1 {
            Some(f) => f,
            None => return Ok(None),
        };
        let mut buf = Vec::with_capacity(96);
        let doc = b::open(&mut buf);
        for (name, allowed) in fields {
            let v = ffi::PyObject_GetAttr(o, name.as_ptr());
            if v.is_null() {
                ffi::PyErr_Clear();
                return Ok(None);
            }
            let v = Bound::from_owned_ptr(py, v);
            let vp = v.as_ptr();
            if !allowed.contains(&(ffi::Py_TYPE(vp) as usize)) || !plain_json(vp, 60) {
                return Ok(None);
            }
            let key = match b::utf8(name.as_ptr()) {
                Some(k) => k,
                None => return Ok(None),
            };
            put_py(py, &mut buf, key, vp, self.e.utc.as_ptr(), self.e.encode_value.bind(py))?;
        }
        b::end(&mut buf, doc);
        Ok(Some(buf))
    }

    /// The inbox archive's document of an evicted entry, as
    /// `aggregates.dedup.archive.InboxArchive.write` builds it: `_id` (the length-prefixed
    /// key), `a`, `m`, `at` (archived at), `t`, `h` (when it has one), `w` (a run stamp's
    /// write version), `x` (the expiry: `max(t, now) + horizon + clock_skew`, put as far ahead
    /// of the store's clock as of the writer's; undated ids have none).
    fn archive_doc(&self, en: &Entry, horizon_us: i64, skew_us: i64) -> Vec<u8> {
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
    fn finish(mut self, py: Python<'_>, max_bytes: i64, attempt: i64) -> PyResult<Option<NativeFold>> {
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

fn digits(i: usize) -> i64 {
    let mut n = 1;
    let mut v = i / 10;
    while v > 0 {
        n += 1;
        v /= 10;
    }
    n
}

/// The entries as an array element `name`.
fn put_entries(buf: &mut Vec<u8>, name: &[u8], entries: &[Vec<u8>]) {
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
fn partition(aid: &[u8]) -> i64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(aid);
    d[7] as i64
}

/// A Python value as element `name`.
///
/// Safety: GIL held.
unsafe fn put_py(
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
unsafe fn put_doc(
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
unsafe fn scalar_storable(v: *mut ffi::PyObject) -> bool {
    if b::is_str(v) {
        return b::utf8(v).is_some();
    }
    if b::is_int(v) {
        return b::int64(v).is_some();
    }
    true
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fold_init, m)?)?;
    m.add_function(wrap_pyfunction!(fold_slice, m)?)?;
    m.add_class::<TypeSpec>()?;
    m.add_class::<NativeSnap>()?;
    m.add_class::<NativeFold>()?;
    m.add_class::<FoldCtx>()?;
    Ok(())
}

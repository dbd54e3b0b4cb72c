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
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::bsonw as b;
use crate::slots::{dict_get, Slots};
use crate::snap::{could_be_archived, Entry, NativeSnap};
use crate::values::{hw_key, msg_time_ms, plain_json, plain_state, storable};
use crate::write::{put_py, scalar_storable};

// ---------------------------------------------------------------- environment

/// The Python classes and functions the fold needs, registered once by
/// `aggregates.store.nativefold`.
pub struct Env {
    pub(crate) message: Slots,
    pub(crate) emit: Slots,
    pub(crate) source: Slots,
    pub(crate) outcome: Slots,
    pub(crate) aggregate_ref: Py<PyType>,
    pub(crate) utc: Py<PyAny>,
    /// `bson.encode({"v": value}, codec_options=...)` for values not encoded here.
    pub(crate) encode_value: Py<PyAny>,
    /// `aggregates.core.tracecontext.trace_headers`.
    pub(crate) trace_headers: Py<PyAny>,
    /// `aggregates.domain.aggregate.dump_payload_checked`.
    pub(crate) dump_payload: Py<PyAny>,
    /// `aggregates.codec.check.scalar_dataclass_fields`, and what it said per class.
    pub(crate) scalar_fields: Py<PyAny>,
    pub(crate) payload_fields: Mutex<HashMap<usize, PayloadFields>>,
    /// `"aggbox-kind"` and `"event"`.
    pub(crate) kind_header: Py<PyString>,
    pub(crate) kind_event: Py<PyString>,
    pub(crate) s_applied: Py<PyString>,
    pub(crate) s_duplicate: Py<PyString>,
    pub(crate) empty_tuple: Py<PyTuple>,
    pub(crate) namespace: [u8; 16],
    /// pymongo's `InsertOne`, `UpdateOne` and bson's `RawBSONDocument`: the writes as sent.
    pub(crate) insert_one: Py<PyAny>,
    pub(crate) update_one: Py<PyAny>,
    pub(crate) raw_document: Py<PyAny>,
    pub(crate) s_id: Py<PyString>,
    pub(crate) s_v: Py<PyString>,
    pub(crate) s_upsert: Py<PyString>,
}

/// A payload class (kept alive) and its scalar fields, when it has only such fields.
type PayloadFields = (Py<PyAny>, Arc<Option<Vec<(Py<PyString>, Vec<usize>)>>>);

static ENV: OnceLock<Env> = OnceLock::new();

pub(crate) fn env() -> PyResult<&'static Env> {
    ENV.get().ok_or_else(|| PyRuntimeError::new_err("_aggbox_native.fold_init was not called"))
}

const MSG_FIELDS: [&str; 11] = [
    "message_id", "type", "aggregate_type", "aggregate_id", "payload", "occurred_at",
    "source", "correlation_id", "causation_id", "headers", "schema_version",
];
pub(crate) const M_ID: usize = 0;
pub(crate) const M_TYPE: usize = 1;
pub(crate) const M_ATYPE: usize = 2;
pub(crate) const M_AID: usize = 3;
pub(crate) const M_PAYLOAD: usize = 4;
pub(crate) const M_AT: usize = 5;
pub(crate) const M_SOURCE: usize = 6;
pub(crate) const M_CORR: usize = 7;
pub(crate) const M_HEADERS: usize = 9;
pub(crate) const M_SV: usize = 10;
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

// ---------------------------------------------------------------- typed payloads

/// A typed handler's payload class when it is a plain dataclass of scalar fields: its
/// payload objects are built here from a payload dict whose values all have exactly a type
/// the field takes as it is (what pydantic's validation gives for them: the class's
/// `__new__`, then its `__dict__` in field order, missing fields from their defaults); any
/// other payload is validated by pydantic (the glue decides which classes qualify:
/// `aggregates.store.nativefold._direct_payload`).
#[pyclass(frozen, module = "_aggbox_native")]
pub struct DirectPayload {
    cls: Py<PyType>,
    /// (name, exact types taken as they are, the default when the field has one)
    fields: Vec<(Py<PyString>, Vec<usize>, Option<Py<PyAny>>)>,
}

#[pymethods]
impl DirectPayload {
    #[new]
    fn new(cls: Py<PyType>, fields: Vec<(Py<PyString>, Vec<Bound<'_, PyType>>, bool, Py<PyAny>)>) -> Self {
        DirectPayload {
            cls,
            fields: fields
                .into_iter()
                .map(|(n, ts, has_default, d)| {
                    (n, ts.iter().map(|t| t.as_ptr() as usize).collect(), has_default.then_some(d))
                })
                .collect(),
        }
    }

    /// The payload object of `payload` (for the tests); None when pydantic must decide.
    fn make<'py>(&self, py: Python<'py>, payload: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.build(py, payload)
    }
}

impl DirectPayload {
    fn build<'py>(&self, py: Python<'py>, payload: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let pp = payload.as_ptr();
        // SAFETY: GIL held; dict reads of an exact dict; the new object is ours.
        unsafe {
            if !b::is_dict(pp) {
                return Ok(None);
            }
            let mut found = 0;
            let mut values: Vec<*mut ffi::PyObject> = Vec::with_capacity(self.fields.len());
            for (name, allowed, default) in &self.fields {
                let v = dict_get(pp, name.as_ptr());
                if v.is_null() {
                    match default {
                        Some(d) => values.push(d.as_ptr()),
                        None => return Ok(None), // missing: pydantic names it
                    }
                    continue;
                }
                if !allowed.contains(&(ffi::Py_TYPE(v) as usize)) {
                    return Ok(None);
                }
                found += 1;
                values.push(v);
            }
            if found != ffi::PyDict_Size(pp) as usize {
                return Ok(None); // keys the class does not have: pydantic's rules
            }
            let tp = self.cls.as_ptr() as *mut ffi::PyTypeObject;
            let new = match (*tp).tp_new {
                Some(f) => f,
                None => return Ok(None),
            };
            let empty = ffi::PyTuple_New(0);
            let o = new(tp, empty, std::ptr::null_mut());
            ffi::Py_DECREF(empty);
            if o.is_null() {
                return Err(PyErr::fetch(py));
            }
            let obj = Bound::from_owned_ptr(py, o);
            let d = ffi::PyObject_GenericGetDict(o, std::ptr::null_mut());
            if d.is_null() {
                return Err(PyErr::fetch(py));
            }
            let dict = Bound::from_owned_ptr(py, d);
            for ((name, _, _), v) in self.fields.iter().zip(values) {
                if ffi::PyDict_SetItem(dict.as_ptr(), name.as_ptr(), v) != 0 {
                    return Err(PyErr::fetch(py));
                }
            }
            Ok(Some(obj))
        }
    }
}

// ---------------------------------------------------------------- the aggregate type

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Dedup {
    None,
    Inbox { window: usize, horizon_us: i64, skew_us: i64, always: bool },
    High { contiguous: bool, max_sources: usize },
}

/// What the fold needs of one aggregate type (built once per type by the glue).
#[pyclass(frozen, module = "_aggbox_native")]
pub struct TypeSpec {
    pub(crate) name_b: Vec<u8>,
    pub(crate) dedup: Dedup,
    pub(crate) max_outbox: usize,
    pub(crate) topic: Option<Py<PyAny>>,
    pub(crate) state_version: i64,
    /// message type → (function, typed payload parser or None)
    pub(crate) handlers: Py<PyDict>,
    /// `atype.load_state`, `codec.dump_checked`, `codec._loaded` (a ContextVar).
    pub(crate) load_state: Py<PyAny>,
    pub(crate) dump_checked: Py<PyAny>,
    pub(crate) loaded: Py<PyAny>,
    /// A scalar-field dataclass state: its class and (field name, allowed exact types).
    pub(crate) fast_state: Option<(Py<PyAny>, Vec<(Py<PyString>, Vec<usize>)>)>,
    pub(crate) plain_dict: bool,
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

// ---------------------------------------------------------------- the fold

/// What one message of the slice came to.
pub(crate) struct Done {
    pub(crate) msg: Py<PyAny>,
    pub(crate) applied: bool,
    pub(crate) emitted: Vec<String>,
}

/// The state after a message: its object, and its document when the codec had to dump it
/// (None: a scalar-field dataclass or plain dict, encoded directly at the end).
pub(crate) struct StateNow {
    pub(crate) obj: Py<PyAny>,
    pub(crate) doc: Option<Py<PyAny>>,
}

/// The result of a native fold, read by the pass as it reads a `FoldResult`: the write,
/// the outcomes, the archive entries, and the snapshot once settled.
#[pyclass(module = "_aggbox_native")]
pub struct NativeFold {
    /// The write as pymongo sends it (`InsertOne`/`UpdateOne` of a `RawBSONDocument`), or
    /// None when the slice changes nothing.
    #[pyo3(get)]
    pub(crate) op: Option<Py<PyAny>>,
    /// The write's BSON (the new document, or the update document).
    #[pyo3(get)]
    pub(crate) op_bytes: Option<Py<PyBytes>>,
    #[pyo3(get)]
    pub(crate) op_insert: bool,
    #[pyo3(get)]
    pub(crate) outcomes: Py<PyList>,
    /// Inbox entries leaving the document with this write, as `[id, occurred_at, hash(,
    /// tag)]` lists (archived first, `aggregates.dedup.archive`).
    #[pyo3(get)]
    pub(crate) archive: Py<PyList>,
    /// The snapshot after the write, set by `settle()`.
    #[pyo3(get)]
    pub(crate) snapshot: Option<Py<NativeSnap>>,
    pub(crate) snap: Option<NativeSnap>,
    pub(crate) empty_list: Py<PyList>,
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
    pub(crate) spec: Py<TypeSpec>,
    pub(crate) now: Py<PyAny>,
    pub(crate) max_document_bytes: i64,
    pub(crate) stamp: Option<(String, String)>,
    pub(crate) codec_options: Py<PyAny>,
    /// The store's clock when it is not the writer's (the archive's expiry is put as far
    /// ahead of it: `aggregates.dedup.archive.InboxArchive.write`).
    pub(crate) store_now: Option<Py<PyAny>>,
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

pub(crate) struct Folder<'a> {
    pub(crate) e: &'a Env,
    pub(crate) spec: &'a TypeSpec,
    pub(crate) snap: NativeSnap,
    pub(crate) now_ms: i64,
    pub(crate) now_us: i64,
    pub(crate) stamp: Option<(String, String)>,
    pub(crate) state: Option<StateNow>,
    pub(crate) applied: bool,
    /// Inbox entries added by this fold (pending: never evicted by its own write).
    pub(crate) pending: usize,
    /// hw keys changed, in first-change order, and the marks before the first change.
    pub(crate) hw_changed: Vec<String>,
    pub(crate) before: Vec<(String, i64)>,
    pub(crate) done: Vec<Done>,
    /// This fold's outbox entries as BSON documents, in order.
    pub(crate) entries: Vec<Vec<u8>>,
    /// Message ids already recorded (inbox index, built on first use).
    pub(crate) index: Option<HashMap<String, Option<String>>>,
    pub(crate) store_now_us: Option<i64>,
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

    pub(crate) fn own_run(&self) -> bool {
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
            let (func, parse, direct) = match h.cast::<PyTuple>() {
                Ok(t) if t.len() == 3 => (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?),
                _ => return Ok(false),
            };
            let state = self.state.as_ref().expect("loaded").obj.clone_ref(py);
            let result = if parse.is_none() {
                func.call1((state, m))
            } else {
                let payload = Bound::from_borrowed_ptr(py, e.message.get(mp, M_PAYLOAD));
                let built = match direct.cast::<DirectPayload>() {
                    Ok(d) => d.get().build(py, &payload)?,
                    Err(_) => None,
                };
                let parsed = match built {
                    Some(obj) => Ok(obj),
                    None => parse.call1((payload,)),
                };
                match parsed {
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
        // The lock is never held while Python runs (another thread may hold it then and
        // wait for the GIL): the class's fields are looked up, or found, without it.
        let known = e.payload_fields.lock().unwrap().get(&cls).map(|(_, f)| f.clone());
        let fields = match known {
            Some(f) => f,
            None => {
                let c = Bound::from_borrowed_ptr(py, cls as *mut ffi::PyObject);
                let found = e.scalar_fields.bind(py).call1((&c,))?;
                let fields = if found.is_none() {
                    None
                } else {
                    let mut v = Vec::new();
                    for item in found.try_iter()? {
                        let (name, allowed): (Bound<'_, PyString>, Vec<Bound<'_, PyAny>>) =
                            item?.extract()?;
                        v.push((PyString::intern(py, name.to_str()?).unbind(),
                                allowed.iter().map(|t| t.as_ptr() as usize).collect()));
                    }
                    Some(v)
                };
                let fields = Arc::new(fields);
                e.payload_fields.lock().unwrap().insert(cls, (c.unbind(), fields.clone()));
                fields
            }
        };
        let fields = match fields.as_ref() {
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

}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fold_init, m)?)?;
    m.add_function(wrap_pyfunction!(fold_slice, m)?)?;
    m.add_class::<TypeSpec>()?;
    m.add_class::<NativeSnap>()?;
    m.add_class::<NativeFold>()?;
    m.add_class::<FoldCtx>()?;
    m.add_class::<DirectPayload>()?;
    Ok(())
}

//! Reading and filling the slots of aggbox's frozen, slotted dataclasses (`Message`, `Emit`,
//! `Source`, `Outcome`) by the member descriptors' offsets, read once from the classes: the
//! same objects their `__init__` builds, without a descriptor call per field.

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

/// `Py_T_OBJECT_EX`: a slot holding an object (an unset slot reads as NULL).
const T_OBJECT_EX: i32 = 16;

/// One slotted class and its slots' byte offsets, in the order asked for.
pub struct Slots {
    pub cls: Py<PyType>,
    offsets: Vec<isize>,
}

impl Slots {
    /// The slots `names` of `cls` (each must be a member descriptor of `cls` itself).
    pub fn of(cls: &Bound<'_, PyType>, names: &[&str]) -> PyResult<Slots> {
        let dict = cls.getattr("__dict__")?;
        let mut offsets = Vec::with_capacity(names.len());
        for name in names {
            let d = dict.get_item(PyString::new(cls.py(), name))?;
            let tname = d.get_type().name()?.to_string();
            if tname != "member_descriptor" {
                return Err(PyTypeError::new_err(format!(
                    "{}.{name} is a {tname}, not a slot",
                    cls.name()?
                )));
            }
            // SAFETY: a member descriptor (checked above) is a PyMemberDescrObject whose
            // d_member points to its PyMemberDef (pyo3-ffi types the field loosely).
            let def = unsafe {
                let descr = d.as_ptr() as *mut ffi::PyMemberDescrObject;
                (*descr).d_member as *mut ffi::PyMemberDef
            };
            let (offset, code) = unsafe { ((*def).offset, (*def).type_code) };
            if code != T_OBJECT_EX {
                return Err(PyTypeError::new_err(format!("{name}: not an object slot")));
            }
            offsets.push(offset as isize);
        }
        Ok(Slots { cls: cls.clone().unbind(), offsets })
    }

    /// Whether `o`'s type is exactly this class.
    ///
    /// Safety: `o` is a valid object.
    pub unsafe fn is(&self, o: *mut ffi::PyObject) -> bool {
        ffi::Py_TYPE(o) as *mut ffi::PyObject == self.cls.as_ptr()
    }

    /// Slot `i` of `o` (borrowed; NULL when unset).
    ///
    /// Safety: `o` is exactly this class (see [`Slots::is`]).
    pub unsafe fn get(&self, o: *mut ffi::PyObject, i: usize) -> *mut ffi::PyObject {
        *((o as *mut u8).offset(self.offsets[i]) as *mut *mut ffi::PyObject)
    }

    /// A new, empty instance (every slot NULL): fill each with [`Slots::set`].
    pub fn alloc<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the class is a heap type with object slots; tp_alloc zeroes them.
        unsafe {
            let tp = self.cls.as_ptr() as *mut ffi::PyTypeObject;
            let alloc = (*tp).tp_alloc.unwrap_or(ffi::PyType_GenericAlloc);
            let o = alloc(tp, 0);
            if o.is_null() {
                return Err(PyErr::fetch(py));
            }
            Ok(Bound::from_owned_ptr(py, o))
        }
    }

    /// Sets slot `i` of a new instance from [`Slots::alloc`] to `v` (a new reference is taken).
    ///
    /// Safety: `o` is a new instance of this class whose slot `i` is still NULL.
    pub unsafe fn set(&self, o: &Bound<'_, PyAny>, i: usize, v: &Bound<'_, PyAny>) {
        let at = (o.as_ptr() as *mut u8).offset(self.offsets[i]) as *mut *mut ffi::PyObject;
        ffi::Py_INCREF(v.as_ptr());
        *at = v.as_ptr();
    }
}

/// `dict.get(key)` without raising (borrowed result, NULL when absent).
///
/// Safety: `d` is a dict, GIL held.
pub unsafe fn dict_get(d: *mut ffi::PyObject, key: *mut ffi::PyObject) -> *mut ffi::PyObject {
    let v = ffi::PyDict_GetItemWithError(d, key);
    if v.is_null() && !ffi::PyErr_Occurred().is_null() {
        ffi::PyErr_Clear();
    }
    v
}


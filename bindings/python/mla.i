/*
 * SWIG interface of libmla: the low-level module `mla.core` (Python proxies)
 * over the C extension `mla._core`, generated from the real public header.
 *
 * Everything in include/mla.h is wrapped under its C name (functions,
 * structs with their fields, enum values and #define constants). Conventions:
 *
 *   - Data pointers (const void *, void *, const uint8_t *, const int32_t *,
 *     float *) are addresses: a Python int (anything with __index__) or None
 *     for NULL, in struct fields and in arguments (the `stream` argument too).
 *     Reading such a field gives an int (0 for NULL). The caller keeps the
 *     memory alive for as long as the library may read it.
 *   - Output arguments become extra return values:
 *         status, plan   = mla_plan_create(desc)
 *         status, nbytes = mla_plan_workspace_size(plan)
 *         status, kind   = mla_plan_backend(plan)
 *   - mla_plan * is an opaque SWIG pointer; int(plan) is its address.
 *     Nothing frees it implicitly: call mla_plan_destroy exactly once.
 *   - Every function releases the GIL while libmla runs.
 *
 * The pythonic API is the `mla` package (mla.Plan); this module is its base.
 */
%define MLA_CORE_DOC
"Low-level SWIG wrapper of libmla's C API (include/mla.h), one to one.

Pointers are passed as integer addresses (None = NULL); output arguments are
returned after the status. Prefer the pythonic mla.Plan."
%enddef
%module(package="mla", docstring=MLA_CORE_DOC) core

%feature("autodoc", "2");

%{
#include "mla.h"
%}

%include <stdint.i>

/* ---- addresses as Python ints ------------------------------------------ */

%define MLA_ADDRESS_TYPEMAPS(TYPE)
%typemap(in) TYPE {
    if ($input == Py_None) {
        $1 = NULL;
    } else if (PyIndex_Check($input)) {
        PyObject *index_ = PyNumber_Index($input);
        void *address_;
        if (!index_) SWIG_fail;
        address_ = PyLong_AsVoidPtr(index_);
        Py_DECREF(index_);
        if (address_ == NULL && PyErr_Occurred()) SWIG_fail;
        $1 = ($1_ltype)address_;
    } else {
        PyErr_Format(PyExc_TypeError, "$symname: expected an address (int) or None for '$1_name', got %s",
                     Py_TYPE($input)->tp_name);
        SWIG_fail;
    }
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) TYPE {
    $1 = ($input == Py_None || PyIndex_Check($input)) ? 1 : 0;
}
%typemap(out) TYPE {
    $result = PyLong_FromVoidPtr((void *)$1);
}
%enddef

MLA_ADDRESS_TYPEMAPS(const void *)
MLA_ADDRESS_TYPEMAPS(void *)
MLA_ADDRESS_TYPEMAPS(const uint8_t *)
MLA_ADDRESS_TYPEMAPS(const int32_t *)
MLA_ADDRESS_TYPEMAPS(float *)

/* mla_status_string / mla_last_error_message return static or thread-local
 * strings: copy, never free. (SWIG's default for const char * already does.) */

/* ---- output arguments --------------------------------------------------- */

%typemap(in, numinputs=0) mla_plan **plan (mla_plan *created = NULL) {
    $1 = &created;
}
%typemap(argout) mla_plan **plan {
    $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(SWIG_as_voidptr(*$1), $*1_descriptor, 0));
}

%typemap(in, numinputs=0) size_t *bytes (size_t value = 0) {
    $1 = &value;
}
%typemap(argout) size_t *bytes {
    $result = SWIG_Python_AppendOutput($result, PyLong_FromSize_t(*$1));
}

%typemap(in, numinputs=0) mla_backend *backend (mla_backend value = MLA_BACKEND_AUTO) {
    $1 = &value;
}
%typemap(argout) mla_backend *backend {
    $result = SWIG_Python_AppendOutput($result, PyLong_FromLong((long)*$1));
}

%feature("docstring") mla_plan_create
"Returns [status, plan]: plan is the new mla_plan * (None on failure).";
%feature("docstring") mla_plan_workspace_size
"Returns [status, bytes].";
%feature("docstring") mla_plan_backend
"Returns [status, backend] (an MLA_BACKEND_* value).";
%feature("docstring") mla_plan_build_metadata
"build_metadata(plan, batch, stream) -> status; stream is an int handle or None.";
%feature("docstring") mla_plan_execute
"execute(plan, tensors, stream) -> status; stream is an int handle or None.";

/* ---- the header itself --------------------------------------------------- */

%include "mla.h"

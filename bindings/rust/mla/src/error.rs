//! Status codes and the error type.

use std::ffi::CStr;
use std::fmt;

use mla_sys as sys;

/// Mirror of the C `mla_status`: the result of every libmla call.
///
/// Values are only ever appended in the C header, never renumbered; a value
/// this crate does not know (from a newer library) is kept as
/// [`Status::Unknown`] with its raw number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// `MLA_SUCCESS`: the call succeeded. An [`Error`] never carries it.
    Success,
    /// `MLA_ERROR_NULL_POINTER`: a required pointer argument or field was NULL.
    NullPointer,
    /// `MLA_ERROR_STRUCT_SIZE`: a descriptor's `struct_size` is wrong.
    StructSize,
    /// `MLA_ERROR_INVALID_VALUE`: a dimension, count or scalar is outside its
    /// range (also used by this crate for slices that are too short).
    InvalidValue,
    /// `MLA_ERROR_UNSUPPORTED_DTYPE`: an unsupported dtype or dtype combination.
    UnsupportedDtype,
    /// `MLA_ERROR_INVALID_INDPTR`: `qo_indptr` / `kv_indptr` not starting at
    /// 0, decreasing, or with a sequence length out of range.
    InvalidIndptr,
    /// `MLA_ERROR_INVALID_LAST_PAGE_LEN`: `kv_last_page_len[b]` outside
    /// `1..=page_size`.
    InvalidLastPageLen,
    /// `MLA_ERROR_PAGE_OUT_OF_RANGE`: a page index is negative or `>= num_pages`.
    PageOutOfRange,
    /// `MLA_ERROR_LIMIT_EXCEEDED`: batch size above `max_batch_size` or q_len
    /// above `max_q_len`.
    LimitExceeded,
    /// `MLA_ERROR_NO_METADATA`: execute before a successful build_metadata.
    NoMetadata,
    /// `MLA_ERROR_BACKEND_UNAVAILABLE`: backend not built in, or no device.
    BackendUnavailable,
    /// `MLA_ERROR_INVALID_DEVICE`: bad device ordinal, or plan used on another device.
    InvalidDevice,
    /// `MLA_ERROR_DEVICE_RUNTIME`: a GPU runtime call failed.
    DeviceRuntime,
    /// `MLA_ERROR_OUT_OF_MEMORY`: host or device allocation failed.
    OutOfMemory,
    /// `MLA_ERROR_MISALIGNED`: a pointer does not meet its alignment
    /// (q, kv and out 16 bytes; lse and kv_indices 4 bytes).
    Misaligned,
    /// `MLA_ERROR_WORKSPACE_TOO_SMALL`: caller workspace missing or too small.
    WorkspaceTooSmall,
    /// `MLA_ERROR_DEVICE_VALIDATION_FAILED`: device-side input checks failed.
    DeviceValidationFailed,
    /// `MLA_ERROR_INTERNAL`: a bug in libmla.
    Internal,
    /// A status value this crate does not know.
    Unknown(i32),
}

const TABLE: &[(Status, sys::mla_status)] = &[
    (Status::Success, sys::mla_status::MLA_SUCCESS),
    (Status::NullPointer, sys::mla_status::MLA_ERROR_NULL_POINTER),
    (Status::StructSize, sys::mla_status::MLA_ERROR_STRUCT_SIZE),
    (Status::InvalidValue, sys::mla_status::MLA_ERROR_INVALID_VALUE),
    (Status::UnsupportedDtype, sys::mla_status::MLA_ERROR_UNSUPPORTED_DTYPE),
    (Status::InvalidIndptr, sys::mla_status::MLA_ERROR_INVALID_INDPTR),
    (
        Status::InvalidLastPageLen,
        sys::mla_status::MLA_ERROR_INVALID_LAST_PAGE_LEN,
    ),
    (Status::PageOutOfRange, sys::mla_status::MLA_ERROR_PAGE_OUT_OF_RANGE),
    (Status::LimitExceeded, sys::mla_status::MLA_ERROR_LIMIT_EXCEEDED),
    (Status::NoMetadata, sys::mla_status::MLA_ERROR_NO_METADATA),
    (
        Status::BackendUnavailable,
        sys::mla_status::MLA_ERROR_BACKEND_UNAVAILABLE,
    ),
    (Status::InvalidDevice, sys::mla_status::MLA_ERROR_INVALID_DEVICE),
    (Status::DeviceRuntime, sys::mla_status::MLA_ERROR_DEVICE_RUNTIME),
    (Status::OutOfMemory, sys::mla_status::MLA_ERROR_OUT_OF_MEMORY),
    (Status::Misaligned, sys::mla_status::MLA_ERROR_MISALIGNED),
    (
        Status::WorkspaceTooSmall,
        sys::mla_status::MLA_ERROR_WORKSPACE_TOO_SMALL,
    ),
    (
        Status::DeviceValidationFailed,
        sys::mla_status::MLA_ERROR_DEVICE_VALIDATION_FAILED,
    ),
    (Status::Internal, sys::mla_status::MLA_ERROR_INTERNAL),
];

impl Status {
    /// The status for a raw `mla_status` value.
    pub fn from_raw(raw: i32) -> Status {
        TABLE
            .iter()
            .find(|(_, s)| s.0 as i64 == raw as i64)
            .map(|(st, _)| *st)
            .unwrap_or(Status::Unknown(raw))
    }

    /// The raw `mla_status` value.
    pub fn to_raw(self) -> i32 {
        match self {
            Status::Unknown(v) => v,
            known => TABLE
                .iter()
                .find(|(st, _)| *st == known)
                .map(|(_, s)| s.0 as i32)
                .unwrap_or(-1),
        }
    }

    /// The library's static name of the status (`mla_status_string`), e.g.
    /// `"MLA_ERROR_NULL_POINTER"`.
    pub fn name(self) -> &'static str {
        // SAFETY: mla_status_string never returns NULL and returns a static
        // NUL-terminated string for any value.
        let p = unsafe { sys::mla_status_string(sys::mla_status(self.to_raw() as u32)) };
        if p.is_null() {
            return "MLA_STATUS_UNKNOWN";
        }
        unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("MLA_STATUS_UNKNOWN")
    }

    /// `true` for [`Status::Success`].
    pub fn is_success(self) -> bool {
        self == Status::Success
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<sys::mla_status> for Status {
    fn from(s: sys::mla_status) -> Status {
        Status::from_raw(s.0 as i32)
    }
}

/// Who refused the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// libmla returned the status; the message is `mla_last_error_message()`.
    Library,
    /// This crate refused the call before reaching libmla (a slice too short
    /// for the shapes, a data variant that does not match the plan's dtype,
    /// execute without metadata), so no pointer was ever handed to C.
    Binding,
}

/// A failed libmla call: the status and the sentence explaining it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
    origin: Origin,
}

impl Error {
    /// The status of the failed call (never [`Status::Success`]).
    pub fn status(&self) -> Status {
        self.status
    }

    /// The explanation: for library errors the thread's
    /// `mla_last_error_message()` right after the call, naming the argument
    /// and the refused value.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether libmla or this crate refused the call.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// An error raised by this crate, not by the library.
    pub(crate) fn binding(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
            origin: Origin::Binding,
        }
    }

    /// The error for a non-success status just returned by libmla on this
    /// thread.
    pub(crate) fn from_library(status: sys::mla_status) -> Error {
        Error {
            status: status.into(),
            message: last_error_message(),
            origin: Origin::Library,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status.name())
        } else {
            write!(f, "{}: {}", self.status.name(), self.message)
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// The calling thread's last libmla error message (`""` after a success).
pub fn last_error_message() -> String {
    // SAFETY: never NULL; valid until this thread's next libmla call, and we
    // copy it at once.
    let p = unsafe { sys::mla_last_error_message() };
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Turns a raw status into a `Result`, capturing the message on failure.
pub(crate) fn check(status: sys::mla_status) -> Result<()> {
    if status == sys::mla_status::MLA_SUCCESS {
        Ok(())
    } else {
        Err(Error::from_library(status))
    }
}

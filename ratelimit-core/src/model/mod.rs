//! What a caller asks and what it is answered: the request, the response, and the
//! response's headers.

pub(crate) mod headers;
pub(crate) mod request;
pub(crate) mod response;

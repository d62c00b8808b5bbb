//! What a caller asks and what it is answered: the request, the response, the
//! response's headers, and the moment it is asked at.

pub(crate) mod headers;
pub(crate) mod request;
pub(crate) mod response;
pub(crate) mod time;

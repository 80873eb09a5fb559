//! JSON request bodies: capped, parsed with simd-json, and refused with the spec's exact errors.

use http::StatusCode;
use serde::de::DeserializeOwned;

use super::request::Request;
use super::response::Response;

/// Reads and parses the body as `T`. On failure, the answer to send: 413
/// `{"error":"body too large"}` past `limit` bytes, 400 `{"error":"invalid json"}` for bytes
/// that are not JSON, 400 `{"error":"expected {shape}"}` for JSON of the wrong shape.
pub async fn read_json<T: DeserializeOwned>(
    req: &mut Request<'_>,
    limit: usize,
    shape: &'static str,
) -> Result<T, Response> {
    let mut body = req.read_body(limit).await.map_err(|e| e.answer())?;
    // Building the tape validates the whole document, so any failure after it is a shape
    // mismatch: that is how "invalid json" and "expected {...}" are told apart.
    let mut de = simd_json::Deserializer::from_slice(&mut body)
        .map_err(|_| Response::error(StatusCode::BAD_REQUEST, "invalid json"))?;
    T::deserialize(&mut de)
        .map_err(|_| Response::error(StatusCode::BAD_REQUEST, &format!("expected {shape}")))
}

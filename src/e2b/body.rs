//! JSON request bodies: at most 1 MiB (413 beyond), malformed JSON is a 400 with the parser's
//! reason, and the bodies the SDK may leave out entirely (pause, connect, …) default to empty.

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::{FromRequest, HttpRequest, web};
use serde::de::DeserializeOwned;

use super::error::ApiError;

pub const MAX_BODY: usize = 1024 * 1024;

/// Reads the body under the app's `PayloadConfig` limit (`MAX_BODY`).
async fn read(req: HttpRequest, mut payload: Payload) -> Result<web::Bytes, ApiError> {
    web::Bytes::from_request(&req, &mut payload)
        .await
        .map_err(|e| {
            if e.as_response_error().status_code() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body is larger than {MAX_BODY} bytes"),
                )
            } else {
                ApiError::bad_request(format!("could not read the request body: {e}"))
            }
        })
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// Reads and parses a JSON body; a blank one is `blank`, or a 400 when there is none.
async fn read_json<T: DeserializeOwned>(
    req: HttpRequest,
    payload: Payload,
    blank: Option<T>,
) -> Result<T, ApiError> {
    let bytes = read(req, payload).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return blank.ok_or_else(|| ApiError::bad_request("a JSON request body is required"));
    }
    parse(&bytes)
}

/// A required JSON body.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for Body<T> {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let (req, payload) = (req.clone(), payload.take());
        Box::pin(async move { Ok(Body(read_json(req, payload, None).await?)) })
    }
}

/// A JSON body that may be absent (an empty body means the defaults).
pub struct OptionalBody<T>(pub T);

impl<T: DeserializeOwned + Default + 'static> FromRequest for OptionalBody<T> {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let (req, payload) = (req.clone(), payload.take());
        Box::pin(async move {
            Ok(OptionalBody(
                read_json(req, payload, Some(T::default())).await?,
            ))
        })
    }
}

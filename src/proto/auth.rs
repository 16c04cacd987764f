//! The fleet token on the node protocol: `authorization: Bearer <token>` on every call,
//! compared in constant time by the node.

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Node side: refuses calls without the fleet token.
#[derive(Clone)]
pub struct RequireFleetToken {
    expected: Arc<[u8]>,
}

impl RequireFleetToken {
    pub fn new(token: &str) -> Self {
        RequireFleetToken {
            expected: bearer(token).into_bytes().into(),
        }
    }
}

impl Interceptor for RequireFleetToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match req.metadata().get("authorization") {
            Some(v) if bool::from(v.as_bytes().ct_eq(&self.expected)) => Ok(req),
            Some(_) => Err(Status::unauthenticated("wrong fleet token")),
            None => Err(Status::unauthenticated(
                "missing fleet token: send `authorization: Bearer <token>`",
            )),
        }
    }
}

/// Dispatcher side: attaches the fleet token to every call.
#[derive(Clone)]
pub struct SendFleetToken {
    header: MetadataValue<tonic::metadata::Ascii>,
}

impl SendFleetToken {
    pub fn new(token: &str) -> Result<Self, crate::model::Error> {
        let header = bearer(token)
            .parse()
            .map_err(|_| crate::model::Error::invalid("the fleet token must be printable ASCII"))?;
        Ok(SendFleetToken { header })
    }
}

impl Interceptor for SendFleetToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut()
            .insert("authorization", self.header.clone());
        Ok(req)
    }
}

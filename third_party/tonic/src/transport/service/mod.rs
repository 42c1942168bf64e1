pub(crate) mod grpc_timeout;
#[cfg(feature = "_tls-any")]
pub(crate) mod tls;

pub(crate) use self::grpc_timeout::GrpcTimeout;

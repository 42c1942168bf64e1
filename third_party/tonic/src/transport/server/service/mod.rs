mod io;
pub(crate) use self::io::{ConnectInfoLayer, ServerIo};

#[cfg(feature = "_tls-any")]
mod tls;
#[cfg(feature = "_tls-any")]
pub(crate) use self::tls::TlsAcceptor;

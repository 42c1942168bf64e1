//! lksadmin control server.
